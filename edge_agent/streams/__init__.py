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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_agent.config import StreamSettings
from edge_agent.extras import opencv
from edge_agent.streams.pipeline import Capture, Stream, StreamStats
from edge_agent.streams.sinks import Broadcaster, JsonLines, MqttResults, Sink
from edge_core.errors import ConfigError, EdgeError

__all__ = ["Stream", "StreamStats", "Streams", "open_capture"]

log = logging.getLogger(__name__)


def open_capture(source: str) -> Capture:
    """OpenCV's capture of ``source`` (a file, ``/dev/videoN``, an RTSP or HTTP URL).

    Raises:
        EdgeError: OpenCV cannot open it, or is not installed (the ``video`` extra).
    """
    cv2 = opencv("a stream")
    capture: Any = cv2.VideoCapture(source)
    if not capture.isOpened():
        capture.release()
        raise EdgeError(f"OpenCV cannot open the video source {source!r}")
    opened: Capture = capture
    return opened


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
        check: Any = None,
    ) -> None:
        """``agent()`` is the agent whose ``infer`` each frame goes through; ``check``, the
        agent the models are looked up on now (default: ``agent()``; a reload checks its
        new agent before it runs).

        Raises:
            ConfigError: a stream's model is not on the device, takes no pictures, or
                its sink needs what is not there (mqtt without ``[mqtt]``, a file that
                cannot be opened); nothing is left open.
        """
        self.settings = settings
        self._agent = agent
        self.streams: dict[str, Stream] = {}
        self.sinks: dict[str, Sink] = {}
        looked_up = check if check is not None else agent()
        packages = {  # every stream checked before any sink is opened
            entry.name: _checked(entry, looked_up, connection) for entry in settings
        }

        def infer(model: str, inputs: Any, **kwargs: Any) -> Any:
            return agent().infer(model, inputs, **kwargs)

        def package_of(model: str) -> Any:
            return agent().package(model)

        try:
            for entry in settings:
                sink = self.sinks[entry.name] = self._sink(entry, device_id, connection)
                self.streams[entry.name] = Stream(
                    entry, packages[entry.name], infer=infer, emit=sink, packages=package_of,
                    open_capture=functools.partial(open_source, entry.source),
                    max_pixels=looked_up.max_pixels,
                )  # fmt: skip
        except BaseException:
            self._close_sinks()
            raise

    @staticmethod
    def _sink(entry: StreamSettings, device_id: str, connection: Any) -> Sink:
        if entry.sink == "stdout":
            return JsonLines()
        if entry.sink.startswith("jsonl:"):
            path = Path(entry.sink.removeprefix("jsonl:"))
            try:
                return JsonLines(path)
            except OSError as exc:
                raise ConfigError(
                    f"stream {entry.name}: cannot open {path} for its results: "
                    f"{exc.strerror or exc}"
                ) from None
        if entry.sink == "sse":
            return Broadcaster()
        return MqttResults(connection, device_id, entry.name)

    def start(self) -> None:
        """Load each stream's model (its first frame would pay for it), then start them."""
        for stream in self.streams.values():
            self._agent().warm(stream.package.name)
        for name, stream in self.streams.items():
            stream.start()
            log.info("stream %s: %s through %s", name, stream.settings.source, stream.package.name)

    def stop(self, drain_s: float = 5.0) -> bool:
        """Stop every stream: frames taken finish within ``drain_s`` (all streams
        together). Whether they did. The sinks are closed (event listeners end)."""
        for stream in self.streams.values():
            stream.request_stop()
        deadline = time.monotonic() + drain_s
        drained = [s.join(max(0.0, deadline - time.monotonic())) for s in self.streams.values()]
        self._close_sinks()
        return all(drained)

    def _close_sinks(self) -> None:
        for name, sink in self.sinks.items():
            try:
                sink.close()
            except OSError as exc:
                log.warning("stream %s: closing its sink: %s", name, exc)

    def events(self, name: str) -> Broadcaster | None:
        sink = self.sinks.get(name)
        return sink if isinstance(sink, Broadcaster) else None

    def snapshot(self) -> dict[str, Any]:
        """Per stream: frames in, out, dropped, skipped, failed, degraded, unsent; the
        source's state and reopenings; latencies; what the sink could not send."""
        out = {}
        for name, stream in self.streams.items():
            entry = stream.stats.snapshot()
            entry["sink_dropped"] = self.sinks[name].dropped
            out[name] = entry
        return out


def _checked(entry: StreamSettings, agent: Any, connection: Any) -> Any:
    """The package of ``entry``'s model on ``agent``, once the stream can run: its
    model is on the device and takes pictures, and its sink can be opened.

    Raises:
        ConfigError: it cannot.
    """
    package = agent.package(entry.model)
    if package is None:
        raise ConfigError(
            f"stream {entry.name}: model {entry.model!r} is not on this device (a "
            "stream preprocesses its frames as the model's manifest says)"
        )
    if package.preprocessing is None:
        raise ConfigError(
            f"stream {entry.name}: model {entry.model} takes no pictures (its "
            "manifest has no image preprocessing)"
        )
    if entry.sink == "mqtt" and connection is None:
        raise ConfigError(f"stream {entry.name}: sink mqtt needs an [mqtt] section")
    folder = Path(entry.sink.removeprefix("jsonl:")).parent
    if entry.sink.startswith("jsonl:") and not folder.is_dir():
        raise ConfigError(
            f"stream {entry.name}: cannot open {entry.sink.removeprefix('jsonl:')} "
            f"for its results: no folder {folder}"
        )
    return package
