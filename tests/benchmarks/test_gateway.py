"""``python -m benchmarks gateway`` end to end: both limits and every case, with tiny
settings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cloud_gateway import cpus
from tests.support.paths import ROOT

CORES = sorted(cpus.available())


@pytest.mark.slow
def test_bench_reports_both_limits_and_every_case(tmp_path: Path) -> None:
    out = tmp_path / "gateway.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "gateway",
            "--concurrency",
            "1,4",
            "--seconds",
            "0.4",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    cases = {(c["kind"], c["protocol"], c["batching"], c["clients"]) for c in report["cases"]}
    assert {("noop", p, True, 4) for p in ("grpc", "http")} <= cases
    for protocol in ("grpc", "http"):
        for batching in (True, False):
            assert {("model", protocol, batching, n) for n in (1, 4)} <= cases
    assert all(c["errors"] == 0 and c["requests"] > 0 for c in report["cases"]), report["cases"]
    summary = report["summary"]["grpc"]
    assert summary["lower_limit_per_s"] == min(
        report["model_alone"]["items_per_s"], summary["front_end_alone_per_s"]
    )
    if len(CORES) > 1:
        assert report["inference_cpus"] and report["front_end_cpus"]
    assert "of the lower limit" in result.stdout
