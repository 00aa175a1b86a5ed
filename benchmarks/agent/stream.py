"""``python -m benchmarks stream``: the stream pipeline against a sequential capture loop.

The benchmark writes its own clip: 640x480 at 30 frames a second (Motion-JPEG, what a
USB camera gives), a slow pan across scikit-image photographs (the astronaut's face
among them) with a second face drifting over it, and a still stretch in the middle
(only sensor noise: what key frames are for). Each model (two face detectors,
BlazeFace and CenterFace, and a digits-sized classifier by default) takes the clip
through the agent five ways:

- ``sequential``: decode, preprocess, infer, postprocess in turn, on one thread, the
  file read as fast as it decodes (:meth:`Stream.run_in_turn`);
- ``pipeline``: the same stages on their threads (:meth:`Stream.start`), as fast;
- ``pipeline+key``: the pipeline, frames too like the last inferred one skipped;
- ``camera@R``: the pipeline fed in real time at R frames a second, R the sustained
  rate (the camera's 30, or 90% of what the pipeline kept up when that is less): the
  end-to-end latency (capture to result) a live camera sees;
- ``camera@30``: the pipeline fed at the camera's full rate: when it cannot keep up,
  the newest frame wins and the others are dropped (counted), latency stays bounded.

Targets (MISSION P9): the pipeline at least 1.5x the sequential loop's frames/s when no
stage dominates; at the sustained rate, end-to-end p99 at most 2 frame intervals plus
the slowest stage (its p99 in the same run). When one stage takes more than half of a
frame's time the pipeline cannot gain much (at most the frame's time over that stage's),
and the report says so instead of judging the 1.5x.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.config import StreamSettings
from edge_agent.profiles.schema import DeviceProfile
from edge_agent.streams import Stream, open_capture
from edge_agent.streams.pipeline import STAGES
from edge_core.errors import EdgeError
from edge_core.pictures import image_to_tensor
from edge_core.report import machine_info, render_table
from edge_core.repository import ModelRepository

__all__ = [
    "CLIP_FPS",
    "CLIP_SIZE",
    "StreamBenchSettings",
    "format_stream",
    "run_stream",
    "write_clip",
]

CLIP_SIZE = (640, 480)
CLIP_FPS = 30.0
SPEEDUP_TARGET = 1.5
DOMINANT_SHARE = 0.5  # a stage above this share of a frame's time dominates it
SUSTAINED_SHARE = 0.9  # the live run's rate, of what the pipeline kept up, when below 30

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class StreamBenchSettings:
    models: tuple[str, ...] = (
        "face-detection-short-range",
        "face-detection-centerface",
        "digits-light",
    )
    clip_s: float = 10.0  # of clip
    key_frames: float = 3.0  # the threshold of the key-frame run (mean difference, 0..255)
    clip: Path | None = None  # a clip of one's own, instead of the one written


# -- the clip ------------------------------------------------------------------------------


PHOTOGRAPHS = ("astronaut", "coffee", "chelsea", "rocket")  # in scikit-image's wheel


def _photograph(name: str) -> Array:
    """One of scikit-image's photographs (RGB), or a clear error without it."""
    try:
        from skimage import data
    except ImportError:
        raise EdgeError(
            "the benchmark's clip is made of scikit-image's photographs: install "
            "scikit-image, or give a clip of your own (--clip FILE)"
        ) from None
    photo: Array = getattr(data, name)()
    return photo


def write_clip(path: Path, seconds: float = 10.0, *, seed: int = 0) -> Path:
    """The benchmark's clip (see the module's docstring): 640x480, 30 frames a second,
    Motion-JPEG; moving for the first and last 40%, still between.

    Raises:
        EdgeError: scikit-image is not installed, or OpenCV cannot write the clip.
    """
    import cv2

    width, height = CLIP_SIZE
    parts = []
    for name in PHOTOGRAPHS:  # side by side, each scaled to the clip's height
        photo = _photograph(name)
        size = (round(photo.shape[1] * height / photo.shape[0]), height)
        parts.append(cv2.resize(cv2.cvtColor(photo, cv2.COLOR_RGB2BGR), size))
    panorama = np.concatenate(parts, axis=1)
    head = _photograph("astronaut")[10:230, 140:340]  # the second face, drifting
    face = cv2.resize(cv2.cvtColor(head, cv2.COLOR_RGB2BGR), (150, 165))
    frames = max(1, round(seconds * CLIP_FPS))
    rng = np.random.default_rng(seed)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), CLIP_FPS, CLIP_SIZE)
    if not writer.isOpened():
        raise EdgeError(f"OpenCV cannot write {path} (Motion-JPEG)")
    try:
        t = 0.0  # the clip's own time, which stands still in the middle stretch
        for index in range(frames):
            if not 0.4 <= index / frames < 0.6:
                t += 1 / CLIP_FPS
            x = int(t * 120) % (panorama.shape[1] - width)  # 4 px a frame
            frame = panorama[:, x : x + width].copy()
            fx = int((width - 150) * (0.5 + 0.45 * np.sin(t * 1.3)))
            fy = int((height - 165) * (0.5 + 0.4 * np.cos(t * 0.9)))
            frame[fy : fy + 165, fx : fx + 150] = face
            noise = rng.normal(0.0, 2.0, frame.shape)
            writer.write(np.clip(frame + noise, 0, 255).astype(np.uint8))
    finally:
        writer.release()
    return path


def describe_clip(path: Path) -> dict[str, Any]:
    """A clip's size, frame rate, length and codec, as OpenCV reads them.

    Raises:
        EdgeError: OpenCV cannot open it.
    """
    import cv2

    capture = open_capture(str(path))
    try:
        fps = capture.get(cv2.CAP_PROP_FPS)
        frames = capture.get(cv2.CAP_PROP_FRAME_COUNT)
        code = int(capture.get(cv2.CAP_PROP_FOURCC))
        size = [
            int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)),
            int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT)),
        ]
    finally:
        capture.release()
    return {
        "size": size,
        "fps": round(fps, 3),
        "seconds": round(frames / fps, 2) if fps > 0 else None,
        "codec": "".join(chr((code >> 8 * i) & 0xFF) for i in range(4)).strip(),
    }


# -- the runs ------------------------------------------------------------------------------


class _Sink:
    """Writes each result as a JSON line would be written, and keeps none."""

    def __init__(self) -> None:
        self.results = 0
        self.bytes = 0

    def __call__(self, result: dict[str, Any]) -> None:
        self.results += 1
        self.bytes += len(json.dumps(result, separators=(",", ":")))


def _run(agent: Any, entry: StreamSettings, *, pipelined: bool) -> dict[str, Any]:
    package = agent.package(entry.model)
    sink = _Sink()
    stream = Stream(
        entry,
        package,
        open_capture=lambda: open_capture(entry.source),
        infer=agent.infer,
        emit=sink,
    )
    started = time.perf_counter()
    if pipelined:
        stream.start()
        stream.join()
    else:
        stream.run_in_turn()
    elapsed = time.perf_counter() - started
    snapshot = stream.stats.snapshot()
    latency = snapshot["latency_ms"]
    frames = snapshot["frames"]
    return {
        "frames": frames,
        "seconds": round(elapsed, 3),
        "fps": round(frames["out"] / elapsed, 2) if elapsed > 0 else 0.0,
        "end_to_end_ms": {k: latency["end_to_end"][k] for k in ("p50_ms", "p99_ms", "max_ms")},
        "stages_p50_ms": {s: latency[s]["p50_ms"] for s in STAGES if s in latency},
        "stages_p99_ms": {s: latency[s]["p99_ms"] for s in STAGES if s in latency},
    }


def _slowest(run: dict[str, Any]) -> tuple[str, float, float]:
    """The stage with the highest p50 in a run: its name, p50 and p99."""
    name = max(run["stages_p50_ms"], key=lambda s: run["stages_p50_ms"][s])
    return name, run["stages_p50_ms"][name], run["stages_p99_ms"][name]


def _model(
    agent: Any, clip: Path, camera_fps: float, model: str, settings: StreamBenchSettings
) -> dict[str, Any]:
    base = StreamSettings(
        name="bench", source=str(clip), model=model, sink="stdout", realtime=False
    )
    package = agent.package(model)
    pre = package.preprocessing
    blank = image_to_tensor(np.zeros((*CLIP_SIZE[::-1], 3), np.uint8), pre)
    for _ in range(5):  # loads the model, warms the runtime
        agent.infer(model, {pre.input: blank})
    runs = {
        "sequential": _run(agent, base, pipelined=False),
        "pipeline": _run(agent, base, pipelined=True),
        "pipeline+key": _run(agent, replace(base, key_frames=settings.key_frames), pipelined=True),
    }
    kept = runs["pipeline"]["fps"]
    # the camera's rate when the pipeline keeps it with a margin, else 90% of what it kept
    rate = camera_fps if SUSTAINED_SHARE * kept >= camera_fps else round(SUSTAINED_SHARE * kept, 1)
    live = replace(base, realtime=True)  # the file at its own frame rate, as a camera
    runs[f"camera@{rate:g}"] = _run(
        agent, replace(live, rate=0.0 if rate == camera_fps else rate), pipelined=True
    )
    if rate != camera_fps:  # and at the camera's full rate: the newest frame wins
        runs[f"camera@{camera_fps:g}"] = _run(agent, live, pipelined=True)

    sequential = runs["sequential"]
    frame_ms = sum(sequential["stages_p50_ms"].values())
    stage, stage_p50, _ = _slowest(sequential)
    share = stage_p50 / frame_ms if frame_ms else 0.0
    ceiling = frame_ms / stage_p50 if stage_p50 else 0.0
    speedup = runs["pipeline"]["fps"] / sequential["fps"] if sequential["fps"] else 0.0
    sustained = runs[f"camera@{rate:g}"]
    _, _, live_stage_p99 = _slowest(sustained)
    bound = 2 * 1000.0 / rate + live_stage_p99
    dominated = share > DOMINANT_SHARE
    return {
        "model": model,
        "runs": runs,
        "summary": {
            "slowest_stage": stage,
            "slowest_stage_share": round(share, 3),
            "one_stage_dominates": dominated,
            "pipeline_ceiling": round(ceiling, 2),  # the frame's time over the slowest stage's
            "speedup": round(speedup, 2),
            "key_frames_speedup": round(runs["pipeline+key"]["fps"] / sequential["fps"], 2)
            if sequential["fps"]
            else 0.0,
            "sustained_fps": rate,
            "sustained_p99_ms": sustained["end_to_end_ms"]["p99_ms"],
            "latency_bound_ms": round(bound, 2),
            "meets_speedup_target": None if dominated else speedup >= SPEEDUP_TARGET,
            "meets_latency_target": sustained["end_to_end_ms"]["p99_ms"] <= bound,
        },
    }


def run_stream(
    profile: DeviceProfile, model_dir: Path, settings: StreamBenchSettings = StreamBenchSettings()
) -> dict[str, Any]:
    """Every model of ``settings`` through the five runs; the report (JSON as it is)."""
    from benchmarks.agent.hybrid import bench_agent

    repository = ModelRepository(model_dir)
    agent = bench_agent(profile, repository, None, "", escalate=False, on_device=settings.models)
    try:
        with tempfile.TemporaryDirectory(prefix="edge-bench-stream-") as tmp:
            clip = settings.clip or write_clip(Path(tmp) / "clip.avi", settings.clip_s)
            described = describe_clip(clip)
            described["path"] = str(settings.clip) if settings.clip else None  # None: written
            fps = described["fps"] or CLIP_FPS
            models = [_model(agent, clip, fps, model, settings) for model in settings.models]
    finally:
        agent.close()
    return {
        "benchmark": "stream",
        "machine": machine_info(),
        "profile": profile.id,
        "clip": described,
        "key_frames": settings.key_frames,
        "targets": {"speedup": SPEEDUP_TARGET, "latency": "2 frame intervals + slowest stage p99"},
        "models": models,
    }


def format_stream(report: dict[str, Any]) -> str:
    headers = [
        "model",
        "run",
        "frames/s",
        "x seq",
        "p50 ms",
        "p99 ms",
        "out",
        "dropped",
        "skipped",
        *[f"{s} ms" for s in STAGES],
    ]
    rows = []
    notes = []
    for entry in report["models"]:
        sequential = entry["runs"]["sequential"]["fps"]
        for name, run in entry["runs"].items():
            frames = run["frames"]
            rows.append(
                [
                    entry["model"],
                    name,
                    run["fps"],
                    round(run["fps"] / sequential, 2)
                    if sequential and "camera" not in name
                    else None,
                    run["end_to_end_ms"]["p50_ms"],
                    run["end_to_end_ms"]["p99_ms"],
                    frames["out"],
                    frames["dropped"],
                    frames["skipped"],
                    *[run["stages_p50_ms"].get(s) for s in STAGES],
                ]
            )
        s = entry["summary"]
        if s["one_stage_dominates"]:
            speed = (
                f"{s['slowest_stage']} takes {100 * s['slowest_stage_share']:.0f}% of a frame's "
                f"time: the pipeline can gain at most {s['pipeline_ceiling']}x, got "
                f"{s['speedup']}x (the 1.5x target is for no stage dominating: not judged)"
            )
        else:
            met = "met" if s["meets_speedup_target"] else "MISSED"
            speed = f"pipeline {s['speedup']}x the sequential loop (target 1.5x: {met})"
        latency = "met" if s["meets_latency_target"] else "MISSED"
        notes.append(
            f"{entry['model']}: {speed}; at {s['sustained_fps']:g} frames/s end-to-end p99 "
            f"{s['sustained_p99_ms']} ms, bound {s['latency_bound_ms']} ms ({latency})"
        )
    clip = report["clip"]
    title = (
        f"stream: a {clip['size'][0]}x{clip['size'][1]} {clip['codec']} clip, "
        f"{clip['seconds']:g} s at {clip['fps']:g} frames/s; stage times are p50 "
        f"(profile {report['profile']}, key frames at {report['key_frames']:g})"
    )
    return "\n".join([title, render_table(headers, rows), "", *notes])
