"""``python -m benchmarks privacy``, part two: ``redact`` on a video it writes itself.

A 640x480 clip (:func:`write_clip`): faces from scikit-image (the astronaut's and
the cameraman's heads and LFW faces, 40 to 120 px) drift and bounce over
scikit-image photographs, one background per second. The clip is redacted as
``edge-agent redact`` does it (boxes carried over two frames each way), once
with the stronger check of every frame and once without; then every written
frame is read back, and a frame counts as leaking when less than 95% of a
face's box was hidden, or the checker finds the face there.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.agent.face_scenes import face_crops, face_free_photos, matches
from edge_agent.privacy.faces import Face, FaceFinder
from edge_agent.privacy.redact import Redaction, hidden_area
from edge_agent.privacy.video import redact_video
from edge_core.report import render_table

__all__ = ["format_video", "run_video", "write_clip"]

Array = np.ndarray[Any, Any]
WIDTH, HEIGHT, FPS = 640, 480, 25


def write_clip(
    path: Path, *, seconds: float = 4.0, faces: int = 3, seed: int = 0
) -> list[list[Face]]:
    """Write the clip to ``path`` (MPEG-4); where each face is in each frame. Each face
    moves in a lane of its own (a column of the frame): none hides another."""
    import cv2

    rng = np.random.default_rng(seed)
    crops = face_crops(6)
    backgrounds = [
        cv2.resize(photo, (WIDTH, HEIGHT), interpolation=cv2.INTER_AREA)
        for name, photo in face_free_photos()
        if name in ("coffee", "rocket", "chelsea", "brick", "stereo_motorcycle")
    ]
    movers = []
    lane = WIDTH // faces
    for index in range(faces):
        crop = crops[index * 3 % len(crops)]
        size = int(rng.integers(40, 121))
        x0, y0, x1, y1 = crop.face
        scale = size / (y1 - y0)
        pixels = cv2.resize(
            crop.pixels,
            (round(crop.pixels.shape[1] * scale), round(crop.pixels.shape[0] * scale)),
            interpolation=cv2.INTER_AREA,
        )
        box = np.array([x0, y0, x1, y1], np.float64) * scale
        room = (max(lane - pixels.shape[1], 1), HEIGHT - pixels.shape[0])
        start = rng.uniform([0, 0], room)
        movers.append((pixels, box, index * lane, room, start, rng.uniform(-6, 6, size=2)))
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), FPS, (WIDTH, HEIGHT))
    truth: list[list[Face]] = []
    try:
        for frame_index in range(round(seconds * FPS)):
            frame = backgrounds[frame_index // FPS % len(backgrounds)].copy()
            boxes = []
            for pixels, box, left, room, start, velocity in movers:
                h, w = pixels.shape[:2]
                x, y = _bounce(start + velocity * frame_index, room)
                x += left
                frame[y : y + h, x : x + w] = pixels
                boxes.append(Face(box[0] + x, box[1] + y, box[2] + x, box[3] + y, 1.0))
            truth.append(boxes)
            writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    finally:
        writer.release()
    return truth


def _bounce(position: Array, limits: tuple[int, int]) -> tuple[int, int]:
    """A position moving back and forth between 0 and each limit."""
    out = []
    for value, limit in zip(position, limits, strict=True):
        period = 2 * limit
        folded = value % period
        out.append(int(period - folded if folded > limit else folded))
    return out[0], out[1]


COVERED = 0.95  # a face with less of its box hidden is visible


def _covered(face: Face, hidden: list[Face]) -> bool:
    """Whether the union of the ``hidden`` areas covers :data:`COVERED` of ``face``'s
    box (a row of chin at the edge of a hidden square shows no one)."""
    x0, y0 = int(face.x0), int(face.y0)
    w, h = max(1, int(np.ceil(face.x1)) - x0), max(1, int(np.ceil(face.y1)) - y0)
    mask = np.zeros((h, w), bool)
    for area in hidden:
        ax0, ay0 = max(int(np.floor(area.x0)) - x0, 0), max(int(np.floor(area.y0)) - y0, 0)
        ax1, ay1 = min(int(np.ceil(area.x1)) - x0, w), min(int(np.ceil(area.y1)) - y0, h)
        if ax1 > ax0 and ay1 > ay0:
            mask[ay0:ay1, ax0:ax1] = True
    return float(mask.mean()) >= COVERED


def _leaks(
    target: Path, truth: list[list[Face]], hidden: dict[int, list[Face]], checker: FaceFinder
) -> int:
    """Frames of the written video in which a face is left visible."""
    import cv2

    capture = cv2.VideoCapture(str(target))
    leaking = index = 0
    try:
        while True:
            ok, bgr = capture.read()
            if not ok:
                break
            seen = checker.detect(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
            faces = truth[index] if index < len(truth) else []
            areas = hidden.get(index, [])
            leaking += any(
                not _covered(face, areas) or any(matches(d, face) for d in seen) for face in faces
            )
            index += 1
    finally:
        capture.release()
    return leaking


def run_video(
    detector: FaceFinder,
    checker: FaceFinder,
    redaction: Redaction | None = None,
    *,
    seconds: float = 4.0,
    keep: int = 2,
) -> dict[str, Any]:
    """Redact the clip with and without the per-frame check; frames/s and leaks."""
    redaction = redaction or Redaction()
    runs = []
    with tempfile.TemporaryDirectory(prefix="edge-bench-video-") as tmp:
        source = Path(tmp) / "clip.mp4"
        truth = write_clip(source, seconds=seconds)
        for checked in (True, False):
            target = Path(tmp) / f"redacted-{checked}.mp4"
            hidden: dict[int, list[Face]] = {}

            def seen(index: int, faces: list[Face], into: dict[int, list[Face]] = hidden) -> None:
                into[index] = [hidden_area(face, redaction.mask_scale) for face in faces]

            result = redact_video(
                source,
                target,
                detector,
                checker if checked else None,
                redaction,
                keep=keep,
                on_frame=seen,
            )
            leaking = _leaks(target, truth, hidden, checker)
            runs.append(
                {
                    "checked": checked,
                    "frames": result.frames,
                    "frames_per_second": round(result.fps, 1),
                    "frames_left_visible": leaking,
                    "share_left_visible": round(leaking / result.frames, 4),
                }
            )
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "fps": FPS,
        "seconds": seconds,
        "faces": len(truth[0]) if truth else 0,
        "keep_frames": keep,
        "mode": redaction.mode,
        "runs": runs,
    }


def format_video(report: dict[str, Any]) -> str:
    table = render_table(
        ["per-frame check", "frames", "frames/s", "frames with a face visible", "share"],
        [
            [
                "yes" if run["checked"] else "no",
                run["frames"],
                run["frames_per_second"],
                run["frames_left_visible"],
                run["share_left_visible"],
            ]
            for run in report["runs"]
        ],
    )
    return (
        f"redact on a {report['width']}x{report['height']} clip, {report['seconds']:g} s at "
        f"{report['fps']} frames/s, {report['faces']} moving faces, boxes kept "
        f"{report['keep_frames']} frames each way, {report['mode']}\n{table}"
    )
