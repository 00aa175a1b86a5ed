"""Where a stream's results go: JSON lines (a file or stdout), the device's MQTT
connection (a results topic per stream, QoS 0: a late result is worthless, so nothing
queues behind a lost link), or the local API's server-sent events (each subscriber a
bounded queue: a slow one loses old results, never holds up the stream).

Every sink is bounded; each counts what it could not send (``dropped``).
"""

from __future__ import annotations

import collections
import sys
import threading
from pathlib import Path
from typing import IO, Any, Protocol

from edge_agent.results import json_line
from edge_core.protocol.mqtt import stream_results_topic

__all__ = ["Broadcaster", "JsonLines", "MqttResults", "Sink"]


class Sink(Protocol):
    """Where a stream's results go."""

    dropped: int  # results it could not send (the stream counts those that raised)

    def __call__(self, result: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


_line = json_line


class JsonLines:
    """One JSON object a line, flushed with each: to ``path`` (appended), or stdout."""

    def __init__(self, path: Path | None = None) -> None:
        """Raises:
        OSError: ``path`` cannot be opened for appending."""
        self._own = path is not None
        self._out: IO[str] = path.open("a", encoding="utf-8") if path else sys.stdout
        self._lock = threading.Lock()
        self.dropped = 0

    def __call__(self, result: dict[str, Any]) -> None:
        with self._lock:
            self._out.write(_line(result) + "\n")
            self._out.flush()

    def close(self) -> None:
        if self._own:
            self._out.close()


class MqttResults:
    """Each result published at QoS 0 on ``devices/<id>/streams/<name>/results``; while
    the link is down a result is dropped and counted (paho keeps no QoS 0 message)."""

    def __init__(self, connection: Any, device: str, stream: str) -> None:
        self.connection = connection
        self.topic = stream_results_topic(device, stream)
        self.dropped = 0

    def close(self) -> None:
        pass  # the connection is the device's

    def __call__(self, result: dict[str, Any]) -> None:
        if not self.connection.is_connected():
            self.dropped += 1
            return
        if not self.connection.publish(self.topic, _line(result), qos=0).ok:
            self.dropped += 1


class Broadcaster:
    """The results of one stream to every subscriber of the local API's event stream."""

    def __init__(self, per_subscriber: int = 64, max_subscribers: int = 16) -> None:
        self._per = per_subscriber
        self._max = max_subscribers
        self._subscribers: list[_Subscriber] = []
        self._lock = threading.Lock()
        self._closed = False
        self.dropped = 0  # results a slow subscriber lost, all subscribers together

    def __call__(self, result: dict[str, Any]) -> None:
        line = _line(result)
        with self._lock:
            subscribers = list(self._subscribers)
        for subscriber in subscribers:
            subscriber.put(line)

    def subscribe(self) -> _Subscriber | None:
        """A new subscriber, or ``None`` when there are ``max_subscribers`` already (or
        the stream is gone)."""
        with self._lock:
            if self._closed or len(self._subscribers) >= self._max:
                return None
            subscriber = _Subscriber(self._per, self)
            self._subscribers.append(subscriber)
            return subscriber

    def unsubscribe(self, subscriber: _Subscriber) -> None:
        with self._lock:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

    def close(self) -> None:
        """The stream is gone (stopped, or replaced by a reload): every subscriber ends."""
        with self._lock:
            self._closed = True
            subscribers, self._subscribers = self._subscribers, []
        for subscriber in subscribers:
            subscriber.end()


class _Subscriber:
    def __init__(self, size: int, broadcaster: Broadcaster) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=size)
        self._cond = threading.Condition()
        self._broadcaster = broadcaster
        self.ended = False  # the stream is gone: no more results will come
        self.dropped = 0

    def put(self, line: str) -> None:
        with self._cond:
            if len(self._lines) == self._lines.maxlen:
                self.dropped += 1  # the oldest goes: this subscriber reads too slowly
                self._broadcaster.dropped += 1
            self._lines.append(line)
            self._cond.notify()

    def next(self, timeout: float) -> str | None:
        """The next result's line, or ``None`` after ``timeout`` seconds without one, or
        at once when the stream has ended (see :attr:`ended`)."""
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._lines) or self.ended, timeout):
                return None
            return self._lines.popleft() if self._lines else None

    def end(self) -> None:
        with self._cond:
            self.ended = True
            self._cond.notify_all()

    def close(self) -> None:
        self._broadcaster.unsubscribe(self)
