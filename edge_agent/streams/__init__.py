"""Camera and video streams through the agent: ``[[streams]]`` in its configuration
(``edge-agent run``) or ``edge-agent stream`` on the command line.

- :mod:`.rules`: which frames are dropped (the newest wins), skipped (key frames), paced;
  pure;
- :mod:`.pipeline`: one stream's stages, each on its thread, results in order;
- :mod:`.sinks`: JSON lines, MQTT (QoS 0), the local API's server-sent events;
- :class:`Streams`: a configuration's streams, started and stopped together, with
  their counters for ``/metrics`` and telemetry.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_agent.config import StreamSettings
from edge_agent.streams.pipeline import Capture, Stream, StreamStats
from edge_agent.streams.sinks import Broadcaster, JsonLines, MqttResults, Sink
from edge_core.errors import ConfigError, EdgeError

__all__ = ["Stream", "StreamStats", "Streams", "open_capture"]

log = logging.getLogger(__name__)


def open_capture(source: str) -> Capture:
    """OpenCV's capture of ``source`` (a file, ``/dev/videoN``, an RTSP or HTTP URL).

    Raises:
        EdgeError: OpenCV cannot open it.
    """
    import cv2

    capture = cv2.VideoCapture(source)
    if not capture.isOpened():
        capture.release()
        raise EdgeError(f"OpenCV cannot open the video source {source!r}")
    return capture


class Streams:
    """The streams of a configuration, on the agent of the moment (a reload swaps it)."""

    def __init__(
        self,
        settings: tuple[StreamSettings, ...],
        *,
        agent: Callable[[], Any],
        device_id: str,
        connection: Any = None,
        open_source: Callable[[str], Capture] = open_capture,
    ) -> None:
        """``agent()`` is the agent whose ``infer`` each frame goes through.

        Raises:
            ConfigError: a stream's model is not on the device, takes no pictures, or
                its sink needs what is not there (mqtt without ``[mqtt]``).
        """
        self.settings = settings
        self._agent = agent
        self.streams: dict[str, Stream] = {}
        self.sinks: dict[str, Sink] = {}
        for entry in settings:
            package = agent().package(entry.model)
            if package is None:
                raise ConfigError(
                    f"stream {entry.name}: model {entry.model!r} is not on this device (a "
                    "stream preprocesses its frames as the model's manifest says)"
                )
            sink = self._sink(entry, device_id, connection)
            self.sinks[entry.name] = sink

            def infer(model: str, inputs: Any, **kwargs: Any) -> Any:
                return agent().infer(model, inputs, **kwargs)

            try:
                self.streams[entry.name] = Stream(
                    entry,
                    package,
                    open_capture=functools.partial(open_source, entry.source),
                    infer=infer,
                    emit=sink,
                )
            except EdgeError as exc:
                raise ConfigError(str(exc)) from None

    @staticmethod
    def _sink(entry: StreamSettings, device_id: str, connection: Any) -> Sink:
        if entry.sink == "stdout":
            return JsonLines()
        if entry.sink.startswith("jsonl:"):
            return JsonLines(Path(entry.sink.removeprefix("jsonl:")))
        if entry.sink == "sse":
            return Broadcaster()
        if connection is None:
            raise ConfigError(f"stream {entry.name}: sink mqtt needs an [mqtt] section")
        return MqttResults(connection, device_id, entry.name)

    def start(self) -> None:
        """Load each stream's model (its first frame would pay for it), then start them."""
        for stream in self.streams.values():
            self._agent().warm(stream.package.name)
        for name, stream in self.streams.items():
            stream.start()
            log.info("stream %s: %s through %s", name, stream.settings.source, stream.package.name)

    def stop(self, drain_s: float = 5.0) -> bool:
        """Stop every stream: frames taken finish within ``drain_s``. Whether they did."""
        for stream in self.streams.values():
            stream.request_stop()
        drained = all(stream.join(drain_s) for stream in self.streams.values())
        for sink in self.sinks.values():
            close = getattr(sink, "close", None)
            if close is not None:
                close()
        return drained

    def events(self, name: str) -> Broadcaster | None:
        sink = self.sinks.get(name)
        return sink if isinstance(sink, Broadcaster) else None

    def snapshot(self) -> dict[str, Any]:
        """Per stream: frames in, out, dropped, skipped, failed, degraded; latencies."""
        out = {}
        for name, stream in self.streams.items():
            entry = stream.stats.snapshot()
            dropped = getattr(self.sinks[name], "dropped", None)
            if isinstance(dropped, int):
                entry["sink_dropped"] = dropped
            out[name] = entry
        return out
