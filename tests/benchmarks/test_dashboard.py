"""``python -m benchmarks dashboard``: the Fleet page's load time with a simulated fleet."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT


@pytest.mark.slow
def test_the_dashboard_bench_times_the_fleet_page_of_a_simulated_fleet(tmp_path: Path) -> None:
    out = tmp_path / "dashboard.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks", "dashboard", "--devices", "40",
         "--requests", "3", "--json", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "40 simulated devices (sqlite (embedded)): 32 healthy, 4 hot, 2 degraded, 2 offline" in (
        run.stdout
    )
    report = json.loads(out.read_text())
    assert report["pages"][0]["page"] == "fleet page"
    assert all(p["p50_ms"] > 0 and p["bytes"] > 1000 for p in report["pages"])
