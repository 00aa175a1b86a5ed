"""`python -m benchmarks stream` on a short clip: the clip it writes, every run of it, and
how the report judges the pipeline (no stage dominating, or one that does)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from benchmarks.agent.stream import CLIP_SIZE, describe_clip, format_stream, write_clip
from benchmarks.targets import TARGETS, judge
from tests.support.paths import MODELS


@pytest.mark.slow
def test_the_clip_is_640x480_at_30_frames_a_second_and_still_in_the_middle(
    tmp_path: Path,
) -> None:
    clip = write_clip(tmp_path / "clip.avi", 2.0)
    described = describe_clip(clip)
    assert described["size"] == list(CLIP_SIZE) and described["fps"] == 30.0
    assert described["codec"] == "MJPG" and described["seconds"] == 2.0
    capture = cv2.VideoCapture(str(clip))
    frames = []
    while (read := capture.read())[0]:
        frames.append(cv2.cvtColor(read[1], cv2.COLOR_BGR2GRAY).astype(np.int16))
    capture.release()
    assert len(frames) == 60
    change = [float(np.abs(b - a).mean()) for a, b in itertools.pairwise(frames)]
    moving, still = change[:20], change[26:34]  # still from 40% to 60% of the clip
    assert min(moving) > 3 * max(still)


@pytest.mark.slow
def test_the_benchmark_runs_each_way_and_judges_it(tmp_path: Path) -> None:
    out = tmp_path / "stream.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "stream", "--models", "digits-light",
         "--clip-s", "2", "--model-dir", str(MODELS), "--json", str(out)],
        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "stream" and report["clip"]["path"] is None
    (entry,) = report["models"]
    runs = entry["runs"]
    assert {"sequential", "pipeline", "pipeline+key"} <= set(runs)
    assert any(name.startswith("camera@") for name in runs)
    for name in ("sequential", "pipeline", "pipeline+key"):  # read fast: no frame lost
        assert runs[name]["frames"]["out"] == runs[name]["frames"]["in"] == 60
        assert runs[name]["frames"]["dropped"] == 0
    assert runs["pipeline+key"]["frames"]["skipped"] >= 8  # the still stretch
    assert runs["sequential"]["frames"]["skipped"] == 0
    summary = entry["summary"]
    stages = runs["sequential"]["stages_p50_ms"]
    assert set(stages) == {"decode", "preprocess", "infer", "postprocess"}
    share = max(stages.values()) / sum(stages.values())
    assert summary["slowest_stage_share"] == round(share, 3)
    assert summary["one_stage_dominates"] == (share > 0.5)
    assert format_stream(report) in result.stdout
    (p9,) = [t for t in TARGETS if t.id == "P9"]
    measured, met = judge(p9, report)
    assert "digits-light" in measured and met is not None


def test_a_dominated_model_is_not_judged_on_its_speedup() -> None:
    summary = {"one_stage_dominates": True, "slowest_stage": "infer", "slowest_stage_share": 0.9,
               "pipeline_ceiling": 1.11, "speedup": 1.05, "meets_speedup_target": None,
               "meets_latency_target": True, "sustained_p99_ms": 40.0, "sustained_fps": 20.0,
               "latency_bound_ms": 150.0}  # fmt: skip
    (p9,) = [t for t in TARGETS if t.id == "P9"]
    measured, met = judge(p9, {"models": [{"model": "big", "summary": summary}]})
    assert "infer dominates" in measured and met is True
    missed = {**summary, "meets_latency_target": False}
    assert judge(p9, {"models": [{"model": "big", "summary": missed}]})[1] is False
