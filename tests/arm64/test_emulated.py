"""The installed wheel on an aarch64 interpreter (Raspberry Pi OS 64-bit, emulated):
what it runs on, which profile it detects, the sample models' held-out accuracy
against this machine's in the same run, and ``edge-agent redact`` with the detector
the wheel ships.

Durations measured here are emulated: they are recorded as such, never as
performance figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from skimage import data

from edge_agent.privacy import FaceFinder
from edge_agent.privacy.encoded import decode
from edge_core.report import render_table, write_json
from tests.support.emulator import EMULATED_NOTE, Emulator, clean_env
from tests.support.paths import ROOT
from tests.support.roots import make_root

pytestmark = pytest.mark.slow

HELDOUT = Path(__file__).with_name("heldout.py")
# Emulated FP32 convolutions are the slow part (seconds a digit): digits-heavy's FP32
# variant answers every 9th held-out digit, on both machines alike.
ROW_LIMITS = {"digits-heavy/onnx-fp32": 40}
MAX_POINTS = 0.5  # the largest accuracy difference allowed between the machines
RESULTS = ROOT / "bench-results" / "arm64.json"
# The folder `edge-agent redact` takes its detector from: none, the one the wheel ships
# (["--model-dir", str(folder)] would name another).
REDACT_MODEL_DIR: list[str] = []


def test_the_interpreter_is_aarch64_and_runs_the_installed_wheel(
    emulator: Emulator, tmp_path: Path
) -> None:
    code = "import platform, edge_agent; print(platform.machine()); print(edge_agent.__file__)"
    machine, where = emulator.run("-c", code, cwd=tmp_path).stdout.split()
    assert machine == "aarch64"
    assert not Path(where).is_relative_to(ROOT / "edge_agent")  # the wheel, not the checkout


def test_profile_detect_picks_the_pi_5_on_its_device_tree(
    emulator: Emulator, tmp_path: Path
) -> None:
    pi5 = make_root(
        tmp_path / "pi5", model="Raspberry Pi 5 Model B Rev 1.0",
        compatible=["raspberrypi,5-model-b", "brcm,bcm2712"],
    )  # fmt: skip
    detection = emulator.agent("profile", "detect", "--root", str(pi5), cwd=tmp_path)
    assert detection["profile"] == "raspberry-pi-5" and detection["arch"] == "aarch64"
    assert not detection["generic"] and "asimddp" in detection["int8_features"]
    # on its own root, the architecture is the interpreter's: aarch64, whatever QEMU
    # shows in /proc/cpuinfo
    assert emulator.agent("profile", "detect", cwd=tmp_path)["arch"] == "aarch64"


def held_out(python: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*python, str(HELDOUT), json.dumps(ROW_LIMITS)], cwd=cwd, env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def finish(process: subprocess.Popen[str], timeout: float) -> Any:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err[-4000:]
    return json.loads(out)


def compare(x86: dict[str, Any], arm: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key, here in x86["variants"].items():
        there = arm["variants"][key]
        assert there["rows"] == here["rows"]
        count = len(here["rows"])
        scores = np.abs(np.asarray(here["scores"]) - np.asarray(there["scores"]))
        agree = np.asarray(here["predictions"]) == np.asarray(there["predictions"])
        rows.append({
            "variant": key,
            "rows": count,
            "of": here["of"],
            "x86_64": round(100 * here["correct"] / count, 2),
            "aarch64": round(100 * there["correct"] / count, 2),
            "points": round(100 * (there["correct"] - here["correct"]) / count, 2),
            "same_top1": round(100 * float(agree.mean()), 2),
            "max_abs_score_diff": round(float(scores.max()), 6),
            "aarch64_device": there["device"],
            "emulated_s": there["seconds"],
        })  # fmt: skip
    return rows


def test_every_sample_variant_scores_on_aarch64_as_it_does_on_x86(
    emulator: Emulator, tmp_path: Path
) -> None:
    arm = held_out([str(emulator.python)], tmp_path)
    x86 = finish(held_out([sys.executable], tmp_path), timeout=300)
    aarch64 = finish(arm, timeout=1200)
    assert aarch64["machine"] == "aarch64" and x86["machine"] == "x86_64"
    assert aarch64["versions"] == x86["versions"]  # the same libraries, two architectures
    rows = compare(x86, aarch64)
    assert {row["variant"] for row in rows} == set(aarch64["variants"]) and len(rows) == 7
    table = render_table(
        ["variant", "held-out rows", "x86_64 %", "aarch64 %", "points", "same top-1 %",
         "max |Δscore|"],
        [[r["variant"], f"{r['rows']} of {r['of']}", r["x86_64"], r["aarch64"], r["points"],
          r["same_top1"], r["max_abs_score_diff"]] for r in rows],
    )  # fmt: skip
    print(f"\nheld-out accuracy, x86_64 and aarch64 ({emulator.facts['cpu']}):\n{table}")
    RESULTS.parent.mkdir(exist_ok=True)
    write_json(RESULTS, {
        "benchmark": "arm64",
        "what": "held-out top-1 accuracy of each sample variant, x86_64 and aarch64",
        "emulator": {k: emulator.facts[k] for k in (
            "suite", "python_version", "qemu_version", "cpu", "extras", "wheels", "pinned")},
        "versions": aarch64["versions"],
        "subsampled": {k: f"every {-(-360 // v)}th row" for k, v in ROW_LIMITS.items()},
        "variants": rows,
        "emulated_s_note": EMULATED_NOTE,
    })  # fmt: skip
    for row in rows:
        assert abs(row["points"]) <= MAX_POINTS, row


def test_redact_hides_the_astronauts_face_with_the_shipped_detector(
    emulator: Emulator, tmp_path: Path, face_detectors: tuple[FaceFinder, FaceFinder]
) -> None:
    detector, checker = face_detectors
    photo = tmp_path / "astronaut.jpg"
    ok, encoded = cv2.imencode(".jpg", cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR))
    assert ok
    photo.write_bytes(encoded.tobytes())
    assert len(detector.detect(data.astronaut())) == 1  # there is a face to hide
    out = tmp_path / "out"
    (result,) = emulator.agent(
        "redact", str(photo), "--out", str(out), "--profile", "raspberry-pi-5",
        *REDACT_MODEL_DIR, cwd=tmp_path,
    )  # fmt: skip
    assert result["faces"] == 1 and result["kind"] == "picture"
    redacted = decode((out / "astronaut.jpg").read_bytes())
    assert redacted is not None and redacted.shape == data.astronaut().shape
    assert checker.detect(redacted) == []  # the stronger eye, on this machine
