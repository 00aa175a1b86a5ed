"""A stream's source: frames from OpenCV's capture (a file, ``/dev/videoN``, an RTSP or
HTTP URL), paced, and a live source reopened when it fails.

A file is read once: in real time at its own frame rate (as a camera gives it), or as
fast as it decodes (``realtime = false``); a file that cannot be opened ends the stream
with its error. A live source (a camera, a URL) that cannot be opened or stops giving
frames (unplugged, a network cut) is reopened after a pause that starts at
:data:`REOPEN_FIRST_S` and doubles up to :data:`REOPEN_MAX_S`, said once a spell in the
log, until the stream is stopped; frame numbers go on across reopenings.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from edge_agent.config import StreamSettings
from edge_agent.extras import opencv
from edge_agent.streams.rules import next_due
from edge_core.errors import InputError
from edge_core.images import MAX_IMAGE_PIXELS, check_video

__all__ = ["REOPEN_FIRST_S", "REOPEN_MAX_S", "STATES", "Capture", "Frame", "Source", "is_live"]

log = logging.getLogger(__name__)

Array = np.ndarray[Any, Any]
REOPEN_FIRST_S, REOPEN_MAX_S = 1.0, 30.0
STATES = ("starting", "running", "reconnecting", "ended", "failed")  # a source's


@dataclass
class Frame:
    index: int
    captured: float  # wall-clock time (time.time()), as results carry it
    at: float  # the monotonic clock, for latencies
    pixels: Array  # BGR uint8, H x W x 3
    stages: dict[str, float] = field(default_factory=dict)  # milliseconds


class Capture(Protocol):
    """A source of frames: OpenCV's ``VideoCapture`` (a file, a camera, a URL) or a fake."""

    def read(self) -> tuple[bool, Array | None]: ...

    def release(self) -> None: ...

    def get(self, prop: int) -> float: ...


def is_live(source: str) -> bool:
    """A camera or a URL (not a file): it cannot wait, and is reopened when it fails."""
    return "://" in source or source.startswith("/dev/")


class Source:
    """The frames of one stream's source, until it ends or ``stop`` is set."""

    def __init__(
        self,
        settings: StreamSettings,
        open_capture: Callable[[], Capture],
        *,
        stop: threading.Event,
        clock: Callable[[], float],
        wall: Callable[[], float],
        on_state: Callable[[str], None] = lambda state: None,
        max_pixels: int = MAX_IMAGE_PIXELS,
    ) -> None:
        """``on_state`` hears ``running``, ``reconnecting``, ``ended`` or ``failed``;
        frames over ``max_pixels`` end the stream, failed (reopening would not shrink
        them), by what the source says before a frame is decoded."""
        self.settings = settings
        self.max_pixels = max_pixels
        self.live = is_live(settings.source)
        self.error: str | None = None  # why a file could not be read, when it could not
        self.reopened = 0
        self._open = open_capture
        self._stop = stop
        self._clock = clock
        self._wall = wall
        self._state = on_state
        self._index = 0  # frames read, taken or not: their numbers go on across reopenings

    def frames(self) -> Iterator[Frame]:
        """Every frame the stream takes (its ``rate``), decode time in its stages."""
        pause = REOPEN_FIRST_S
        said = False
        while not self._stop.is_set():
            try:
                capture = self._open()
            except Exception as exc:
                if not self.live:
                    self.error = f"cannot open {self.settings.source}: {exc}"
                    log.error("stream %s: %s", self.settings.name, self.error)
                    self._state("failed")
                    return
                capture = None
                why = f"cannot open it ({exc})"
            if capture is not None:
                self._state("running")
                got = False
                try:
                    for frame in self._read(capture):
                        got = True
                        yield frame
                except InputError as exc:  # frames over the limit: no reopening helps
                    self.error = f"{self.settings.source}: {exc}"
                    log.error("stream %s: %s", self.settings.name, self.error)
                    self._state("failed")
                    return
                finally:
                    capture.release()
                if not self.live or self._stop.is_set():
                    break
                why = "it stopped giving frames"
                if got:
                    pause, said = REOPEN_FIRST_S, False
            level = logging.DEBUG if said else logging.WARNING  # once a spell
            log.log(level, "stream %s: %s: %s; reopened in %.0f s", self.settings.name,
                    self.settings.source, why, pause)  # fmt: skip
            said = True
            self._state("reconnecting")
            if self._stop.wait(pause):
                break
            pause = min(pause * 2, REOPEN_MAX_S)
            self.reopened += 1
        self._state("ended")

    def _read(self, capture: Capture) -> Iterator[Frame]:
        cv2 = opencv("a stream")
        name, limit = self.settings.source, self.max_pixels
        width, height = (
            capture.get(cv2.CAP_PROP_FRAME_WIDTH),
            capture.get(cv2.CAP_PROP_FRAME_HEIGHT),
        )
        check_video(int(width or 0), int(height or 0), 0, limit, 1, name)
        realtime = self.settings.realtime and not self.live  # a live source sets its own pace
        fps = capture.get(cv2.CAP_PROP_FPS) if realtime else 0.0
        interval = 1.0 / fps if fps and fps > 0 else 0.0
        started, due, first = self._clock(), self._clock(), self._index
        while not self._stop.is_set():
            if interval:  # a file, in real time: frame n at its own time
                wait = started + (self._index - first) * interval - self._clock()
                if wait > 0 and self._stop.wait(wait):
                    return
            before = self._clock()
            ok, pixels = capture.read()
            if not ok or pixels is None:
                return
            now = self._clock()
            check_video(pixels.shape[1], pixels.shape[0], 0, limit, 1, name)  # it may lie
            self._index += 1
            take, due = next_due(due, now, self.settings.rate)
            if take:
                frame = Frame(self._index - 1, self._wall(), now, pixels)
                frame.stages["decode"] = (now - before) * 1000
                yield frame
