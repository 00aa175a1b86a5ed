"""The fleet simulator, small: its devices speak the real protocol to a real replica,
and its figures come from what the gateway recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT


@pytest.mark.slow
def test_the_fleet_simulator_rolls_out_to_every_device(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "fleet", "--devices", "60",
         "--interval", "0.5", "--jitter", "0.5", "--json", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    ten, full = report["rollouts"]
    assert full["installed"] == full["devices_in_slice"] == 60
    assert ten["installed"] == ten["devices_in_slice"] < 60
    assert report["summary"]["errors"] == 0
    # an update check: the group's rollouts, the device's reports (that it checked is
    # written once a second for every device heard from)
    assert 1.8 <= report["steady"]["queries_per_check"] <= 3.0
    assert "rollout to 100%" in done.stdout
