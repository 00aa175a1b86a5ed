"""Telemetry with store-and-forward: nothing is lost across broker or agent restarts.

Every message first goes into a SQLite queue on disk. A sender thread hands
them to the MQTT connection in order, at QoS 1, while it is connected; a
message leaves the queue only when the broker acknowledges it. So while the
broker is unreachable messages wait on disk, and after a reconnect (or an
agent restart) they go out in order before newer ones.

The queue is bounded (``max_messages``): when it is full the oldest messages
that have not been handed to the connection are dropped and counted, and the
count travels with the next status. A message the connection holds already is
never dropped: the connection delivers it (after a reconnect too, resent), so
the count is exactly the messages that will never arrive.

Delivery is at least once, not exactly once. A consumer sees a message again
(1) as a broker redelivery, flagged DUP, and (2) as a new publish with DUP
unset: after the agent stops without seeing a message acknowledged (a crash,
``kill -9``, a power cut), the next start sends the rows the previous process
had not deleted, and the broker may have had them already. Consumers
de-duplicate by ``(device, seq)``: ``seq`` is the device's sequence number
(persisted in the queue, increasing by one a message), so it also shows gaps
(the dropped count says how many were dropped on purpose).

What the periodic messages say is :mod:`edge_agent.reports`'s. Topics:
``devices/<id>/telemetry/<kind>`` with kinds ``status`` (profile,
model versions, temperatures, power mode, queue), ``decisions``,
``latency`` and ``ota``. The status also carries the link's counters: MQTT
payloads dropped as unparsable (by subscription), and with an offload client
its breaker's state, the exit guard's refusals (by reason) and responses that
matched no request.

Stopping (:meth:`Telemetry.stop`) queues one last periodic report, marked
``"final": true``, so the counts since the last interval are not lost; what
the broker does not take before the stop stays on disk for the next start.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_agent.mqtt import MqttConnection
from edge_core.protocol.mqtt import telemetry_topic

__all__ = ["Telemetry", "TelemetryQueue"]

log = logging.getLogger(__name__)


class TelemetryQueue:
    """A bounded FIFO of messages in SQLite (thread-safe).

    It holds at most ``max_messages`` (or, if that is smaller, the messages in
    flight: those :meth:`claim` marked as handed to the connection, which only
    :meth:`remove` takes out).
    """

    def __init__(self, path: Path, *, max_messages: int = 10_000) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.max_messages = max_messages
        self._lock = threading.Lock()
        # the newest id handed to the connection by this process: it and the older rows
        # still here are in flight (a new process has none; its rows are sent again)
        self._handed = 0
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(
            """
            CREATE TABLE IF NOT EXISTS messages (
                id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL,
                payload BLOB NOT NULL);
            CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
            """
        )

    def _counter(self, name: str) -> int:
        row = self._db.execute("SELECT value FROM counters WHERE name=?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def _add(self, name: str, amount: int) -> int:
        value = self._counter(name) + amount
        self._db.execute(
            "INSERT INTO counters VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET value=excluded.value",
            (name, value),
        )
        return value

    def put(self, topic: str, build: Callable[[int], bytes]) -> int:
        """Queue a message; ``build(seq)`` makes its payload with the next sequence number.

        Over the bound, the oldest messages not in flight are dropped (this one
        too, if nothing older can go) and counted.
        """
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                seq = self._add("seq", 1)
                cursor = self._db.execute(
                    "INSERT INTO messages (topic, payload) VALUES (?, ?)",
                    (topic, build(seq)),
                )
                excess = self._size() - self.max_messages
                if excess > 0:
                    # never a message in flight: the connection delivers it anyway, and
                    # counting it would count a message both delivered and dropped
                    dropped = self._db.execute(
                        "DELETE FROM messages WHERE id IN "
                        "(SELECT id FROM messages WHERE id > ? ORDER BY id LIMIT ?)",
                        (self._handed, excess),
                    ).rowcount
                    self._add("dropped", dropped)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            return int(cursor.lastrowid or 0)

    def _size(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM messages").fetchone()[0])

    def head(self, limit: int, after: int = 0) -> list[tuple[int, str, bytes]]:
        """The oldest messages with an id above ``after``."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, topic, payload FROM messages WHERE id > ? ORDER BY id LIMIT ?",
                (after, limit),
            ).fetchall()
        return [(int(i), str(t), bytes(p)) for i, t, p in rows]

    def claim(self, message_id: int) -> bool:
        """Mark ``message_id``, and every older message, as handed to the connection (in
        flight: :meth:`put` no longer drops them). Claim in order, before handing.

        Returns False if it was dropped meanwhile (counted: do not send it).
        """
        with self._lock:
            if self._db.execute("SELECT 1 FROM messages WHERE id=?", (message_id,)).fetchone():
                self._handed = max(self._handed, message_id)
                return True
            return False

    def remove(self, message_id: int) -> None:
        with self._lock:
            self._db.execute("DELETE FROM messages WHERE id=?", (message_id,))

    @property
    def size(self) -> int:
        with self._lock:
            return self._size()

    @property
    def dropped(self) -> int:
        with self._lock:
            return self._counter("dropped")

    def close(self) -> None:
        with self._lock:
            self._db.close()


class Telemetry:
    """Queues telemetry and forwards it over an :class:`MqttConnection`, at least once
    (consumers de-duplicate by ``(device, seq)``: see the module's docstring).

    ``periodic()`` returns the messages to send every ``interval_s`` (by kind;
    :func:`agent_reports` for an agent); :meth:`emit` queues one at any time
    (OTA events). :meth:`stop` queues a last periodic report.
    """

    def __init__(
        self,
        connection: MqttConnection,
        queue: TelemetryQueue,
        *,
        periodic: Callable[[], dict[str, dict[str, Any]]] = dict,
        interval_s: float = 30.0,
        window: int = 32,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.connection = connection
        self.queue = queue
        self.periodic = periodic
        self.interval_s = interval_s
        self.window = window
        self._clock = clock
        self._inflight: dict[int, int] = {}  # paho mid -> queue id
        # acknowledged before flush_once recorded them: mid -> (accepted, when)
        self._early: dict[int, tuple[bool, float]] = {}
        self._handed = 0  # the newest queue id handed to the connection
        self._resuming = False
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()  # the sender's
        self._stop_reports = threading.Event()  # the periodic reports'
        self._sender: threading.Thread | None = None
        self._reporter: threading.Thread | None = None
        self.sent = 0
        self.refused = 0
        connection.on_published(self._acknowledged)
        connection.on_connection(self._connection_changed)

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        """Queue one message on ``devices/<id>/telemetry/<kind>``."""
        device = self.connection.device_id

        def build(seq: int) -> bytes:
            return json.dumps(
                {"device": device, "seq": seq, "time": self._clock(), "kind": kind, **data},
                default=str,
            ).encode()

        self.queue.put(telemetry_topic(device, kind), build)
        self._wake.set()

    def emit_periodic(self, *, final: bool = False) -> None:
        """Queue the periodic reports (``final``: the last, at a stop, says so)."""
        for kind, data in self.periodic().items():
            if kind == "status":
                data = {
                    **data,
                    "queue": {"waiting": self.queue.size, "dropped": self.queue.dropped},
                    "mqtt": {"dropped": self.connection.dropped_counts()},
                    "interval_s": self.interval_s,  # the gateway's offline rule counts on it
                }
            if final:
                data = {**data, "final": True}
            self.emit(kind, data)

    # -- sending -------------------------------------------------------------------------------

    def _connection_changed(self, connected: bool) -> None:
        if not connected:
            with self._lock:
                # paho keeps what it was handed and sends it again after the reconnect
                # (acknowledged under the same mid); newer messages wait for those, so
                # that the order holds
                self._resuming = True
        self._wake.set()

    def _acknowledged(self, mid: int, accepted: bool) -> None:
        with self._lock:
            message_id = self._inflight.pop(mid, None)
            if message_id is None:
                # the acknowledgement beat flush_once's bookkeeping (paho's thread ran
                # between publish() and the next line there): flush_once settles it
                # (other publishes on the connection land here too: kept briefly)
                now = time.monotonic()
                self._early[mid] = (accepted, now)
                if len(self._early) > 64:
                    self._early = {m: e for m, e in self._early.items() if now - e[1] < 2.0}
                return
        self._settle(message_id, accepted)

    def _settle(self, message_id: int, accepted: bool) -> None:
        if accepted:
            self.sent += 1
        else:  # the broker refused it (its ACL): keeping it would block the queue forever
            self.refused += 1
            log.error("the broker refused telemetry message %d; dropped", message_id)
        self.queue.remove(message_id)
        self._wake.set()

    def flush_once(self) -> int:
        """Hand the next messages to the connection (in order, up to the window)."""
        if not self.connection.connected:
            return 0
        with self._lock:
            if self._resuming:
                if self._inflight:
                    return 0  # the resent ones first
                self._resuming = False
            room = self.window - len(self._inflight)
            after = self._handed
        if room <= 0:
            return 0
        handed = 0
        for message_id, topic, payload in self.queue.head(room, after):
            if not self.queue.claim(message_id):
                continue  # dropped (and counted) since it was read: never sent
            info = self.connection.publish(topic, payload, qos=1)
            with self._lock:
                self._handed = message_id
                early = self._early.pop(info.mid, None)
                if early is not None and time.monotonic() - early[1] > 2.0:
                    early = None  # another publish's, long ago, under a reused mid
                if early is None:
                    # even when the connection just dropped, paho has queued it (QoS 1)
                    self._inflight[info.mid] = message_id
            if early is not None:
                self._settle(message_id, early[0])
            handed += 1
            if not info.ok:
                break
        return handed

    def _send_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                while self.flush_once():
                    pass
            except Exception:
                log.exception("telemetry sender")

    def _periodic_loop(self) -> None:
        while True:
            try:
                self.emit_periodic()
            except Exception:
                log.exception("periodic telemetry")
            if self._stop_reports.wait(self.interval_s):
                return

    def start(self) -> None:
        self._sender = self._spawn(self._send_loop)
        self._reporter = self._spawn(self._periodic_loop)

    @staticmethod
    def _spawn(target: Callable[[], None]) -> threading.Thread:
        thread = threading.Thread(target=target, name=f"telemetry-{target.__name__}", daemon=True)
        thread.start()
        return thread

    def drain(self, timeout: float) -> bool:
        """Wait until the queue is empty (everything acknowledged) or ``timeout`` passes."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.queue.size == 0:
                return True
            self._wake.set()
            time.sleep(0.02)
        return self.queue.size == 0

    def stop(self, drain_s: float = 0.0) -> None:
        """Stop: queue a last periodic report (the counts since the last interval,
        marked ``final``) if :meth:`start` ran, send what the broker acknowledges
        within ``drain_s`` seconds, then end the threads. The rest stays queued on
        disk and goes first after the next start."""
        reporter, self._reporter = self._reporter, None
        if reporter is not None:
            self._stop_reports.set()
            reporter.join(timeout=5)
            try:
                self.emit_periodic(final=True)
            except Exception:
                log.exception("the final telemetry report")
        if drain_s > 0:
            self.drain(drain_s)
        self.connection.forget(self._acknowledged)
        self.connection.forget(self._connection_changed)
        self._stop_reports.set()
        self._stop.set()
        self._wake.set()
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.join(timeout=5)
