"""Video redaction: every frame's faces hidden, boxes carried over a few frames.

A detector that finds a face in frame ``t`` may lose it in frame ``t + 1``
(a turn of the head, motion blur) and find it again in ``t + 2``: that one
frame would leak it. So the faces found in frame ``t`` are hidden in every
frame from ``t - k`` to ``t + k`` (:func:`carried`, pure: frames are held back
``k`` frames to know what comes after them). Each frame is then checked by
the checker (as pictures are, :func:`~edge_agent.privacy.redact.redact_faces`)
unless the caller trades that for speed.

Decoding and encoding are OpenCV's (FFmpeg inside): ``.mp4``, ``.mov`` and
``.mkv`` are written with MPEG-4 Part 2, ``.avi`` with Motion JPEG, other
inputs as ``.mp4``. OpenCV reads and writes pictures only: **the sound track
is not carried** (the output is silent), nor are subtitles or metadata. OpenCV is the
``video`` extra (:mod:`edge_agent.extras`): without it a video is refused with the
command that installs it.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from edge_agent.extras import opencv
from edge_agent.privacy.faces import Face, FaceFinder
from edge_agent.privacy.redact import Redaction, hide, redact_faces
from edge_core.errors import InputError
from edge_core.images import (
    MAX_IMAGE_PIXELS,
    MAX_VIDEO_FRAMES,
    ImageHeader,
    check_pixels,
    check_video,
)

__all__ = [
    "VIDEO_SUFFIXES",
    "VideoResult",
    "carried",
    "output_path",
    "redact_video",
    "video_limits",
]

Array = np.ndarray[Any, Any]
T = TypeVar("T")

VIDEO_SUFFIXES = (".mp4", ".mov", ".mkv", ".avi", ".m4v", ".webm", ".mpg", ".mpeg", ".wmv")
_CODECS = {".mp4": "mp4v", ".mov": "mp4v", ".mkv": "mp4v", ".avi": "MJPG"}
NO_AUDIO = "audio is not carried: the redacted video has no sound track"


def carried(frames: Iterable[tuple[T, list[Face]]], keep: int) -> Iterator[tuple[T, list[Face]]]:
    """Each frame with the faces found in it and in the ``keep`` frames before and
    after it (the boxes as they were found, every one)."""
    window: deque[tuple[T, list[Face]]] = deque()
    past: deque[list[Face]] = deque(maxlen=keep)
    for item in frames:
        window.append(item)
        if len(window) > keep:
            frame, own = window.popleft()
            yield frame, own + [f for faces in past for f in faces] + _ahead(window)
            past.append(own)
    while window:
        frame, own = window.popleft()
        yield frame, own + [f for faces in past for f in faces] + _ahead(window)
        past.append(own)


def _ahead(window: deque[tuple[Any, list[Face]]]) -> list[Face]:
    return [f for _, faces in window for f in faces]


def output_path(source: Path, out_dir: Path) -> Path:
    """Where the redacted copy of ``source`` goes (a container OpenCV writes)."""
    suffix = source.suffix.lower()
    return out_dir / (source.stem + (suffix if suffix in _CODECS else ".mp4"))


@dataclass(frozen=True)
class VideoResult:
    frames: int
    frames_with_faces: int
    faces: int  # found by the detector, over all frames
    checked: bool
    left_visible: int  # frames in which the checker still saw a face after the last round
    seconds: float
    output: Path

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "video",
            "output": str(self.output),
            "frames": self.frames,
            "frames_with_faces": self.frames_with_faces,
            "faces": self.faces,
            "checked": self.checked,
            "frames_left_visible": self.left_visible,
            "frames_per_second": round(self.fps, 1),
            "note": NO_AUDIO,
        }


def redact_video(
    source: Path,
    target: Path,
    detector: FaceFinder,
    checker: FaceFinder | None,
    redaction: Redaction,
    *,
    keep: int = 2,
    on_frame: Callable[[int, list[Face]], None] | None = None,
    max_pixels: int = MAX_IMAGE_PIXELS,
    max_frames: int = MAX_VIDEO_FRAMES,
) -> VideoResult:
    """Redact ``source`` into ``target``; ``checker`` ``None``: frames are not checked.
    ``on_frame(index, hidden)`` is told what was hidden in each frame written.

    A video whose frames are over ``max_pixels``, or that says it has more than
    ``max_frames`` of them, is refused before a frame is decoded; one that goes on
    past ``max_frames`` all the same is stopped there, and ``target`` removed.

    Raises:
        InputError: ``source`` is not a video OpenCV can read, is over a limit, or
            ``target`` cannot be written.
        MissingExtraError: OpenCV is not installed (the ``video`` extra).
    """
    cv2 = opencv("redacting a video")
    capture = _open(cv2, source, max_pixels, max_frames)
    fps = capture.get(cv2.CAP_PROP_FPS) or 25.0
    counts = _Counts()
    started = time.perf_counter()
    frames = _detected(cv2, capture, source, detector, counts, max_pixels, max_frames)
    writer: Any = None
    complete = False
    try:
        for rgb, faces in carried(frames, keep):
            if checker is not None:
                out, left = redact_faces(rgb, faces, checker, redaction)
                counts.left += bool(left)
            else:
                out = hide(rgb, faces, redaction)
            if writer is None:
                writer = _writer(target, fps, out.shape[1], out.shape[0])
            writer.write(cv2.cvtColor(out, cv2.COLOR_RGB2BGR))
            if on_frame is not None:
                on_frame(counts.frames, faces)
            counts.frames += 1
        complete = True
    finally:
        capture.release()
        if writer is not None:
            writer.release()
            if not complete:
                target.unlink(missing_ok=True)  # a video cut short is no redacted copy
    if counts.frames == 0:
        raise InputError(f"{source} has no frame OpenCV can decode")
    return VideoResult(
        frames=counts.frames,
        frames_with_faces=counts.with_faces,
        faces=counts.faces,
        checked=checker is not None,
        left_visible=counts.left,
        seconds=time.perf_counter() - started,
        output=target,
    )


@dataclass
class _Counts:
    """What :func:`redact_video` has seen so far."""

    frames: int = 0
    with_faces: int = 0
    faces: int = 0
    left: int = 0


def _open(cv2: Any, source: Path, max_pixels: int, max_frames: int) -> Any:
    """``source`` opened, and held to the limits by what its container says."""
    capture = cv2.VideoCapture(str(source))
    if not capture.isOpened():
        raise InputError(f"cannot read {source} as a video")
    try:
        video_limits(capture, str(source), max_pixels, max_frames)
    except InputError:
        capture.release()
        raise
    return capture


def _detected(
    cv2: Any,
    capture: Any,
    source: Path,
    detector: FaceFinder,
    counts: _Counts,
    max_pixels: int,
    max_frames: int,
) -> Iterator[tuple[Array, list[Face]]]:
    """Each frame of ``capture`` in RGB with the faces ``detector`` found in it, each
    frame held to the limits as it is decoded (a container's header may lie)."""
    for index in itertools.count():
        ok, bgr = capture.read()
        if not ok:
            return
        if index >= max_frames:
            raise InputError(f"{source} has more than {max_frames:,} frames (max_video_frames)")
        height, width = bgr.shape[:2]
        check_pixels(ImageHeader("video", width, height), max_pixels, f"a frame of {source}")
        rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        faces = detector.detect(rgb)
        counts.with_faces += bool(faces)
        counts.faces += len(faces)
        yield rgb, faces


def video_limits(capture: Any, source: str, max_pixels: int, max_frames: int) -> None:
    """Hold an opened capture to the limits by what its container says
    (:func:`edge_core.images.check_video`).

    Raises:
        InputError: over a limit.
    """
    cv2 = opencv("reading a video")
    width = int(capture.get(cv2.CAP_PROP_FRAME_WIDTH))
    height = int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
    frames = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    check_video(width, height, frames, max_pixels, max_frames, source)


def _writer(target: Path, fps: float, width: int, height: int) -> Any:
    cv2 = opencv("writing a video")
    codec = _CODECS.get(target.suffix.lower(), "mp4v")
    writer = cv2.VideoWriter(str(target), cv2.VideoWriter.fourcc(*codec), fps, (width, height))
    if not writer.isOpened():
        raise InputError(f"cannot write a video to {target}")
    return writer
