"""`python -m benchmarks service` with tiny settings: real daemons, a real gateway and
Mosquitto, a few requests, a three-second soak; the report's shape and sanity."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from benchmarks.agent.service import ServiceSettings, run_service
from benchmarks.agent.service_report import format_service
from tests.support.paths import MODELS

pytestmark = pytest.mark.broker  # the benchmark runs its own Mosquitto

SETTINGS = ServiceSettings(
    requests=30, warmup=5, starts=2, idle_s=0.5, soak_s=3.0, sample_every_s=1.0
)


def _has_mosquitto() -> bool:
    return bool(shutil.which("mosquitto")) or Path("/usr/sbin/mosquitto").exists()


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return run_service(MODELS, SETTINGS)


@pytest.mark.slow
def test_the_api_answers_as_the_agent_does_and_costs_little(report: dict[str, Any]) -> None:
    overhead = report["overhead"]
    assert overhead["same_outputs"] is True
    assert overhead["variant"] == {"in-process": "tflite-int8", "daemon": "tflite-int8"}
    for path in ("in-process", "http", "grpc"):
        stats = overhead["paths"][path]
        assert 0 < stats["p50_ms"] <= stats["p99_ms"]
    # a local API call does the in-process work and more
    assert overhead["paths"]["http"]["p50_ms"] > overhead["paths"]["in-process"]["p50_ms"]
    assert set(overhead["overhead_p50_ms"]) == {"http", "grpc"}


@pytest.mark.slow
def test_startup_and_idle_memory_per_configuration(report: dict[str, Any]) -> None:
    startup = report["startup"]
    assert list(startup) == ["http only", "http + grpc", "everything on"]
    for name, s in startup.items():
        assert len(s["ready_s"]) == SETTINGS.starts and all(v > 0 for v in s["ready_s"]), name
        assert 0 < s["ready_median_s"] <= s["ready_max_s"] < 60
        assert 0 < s["own_start_median_s"] < s["ready_max_s"]  # the interpreter comes first
        assert all(v > 0 for v in s["rss_mb"]) and s["rss_median_mb"] > 10
        assert s["variants"] == {"digits-light": "tflite-int8"}  # the profile's preference
        assert s["rss_target_met"] == (s["rss_max_mb"] <= report["targets"]["idle_rss_mb"])
    # gRPC (grpcio, protobuf, tritonclient's modules) is not free
    assert startup["http + grpc"]["rss_median_mb"] > startup["http only"]["rss_median_mb"] + 3
    if _has_mosquitto():
        assert not report["mqtt"].startswith("skipped")


@pytest.mark.slow
def test_the_import_probe_sees_what_each_configuration_loads(report: dict[str, Any]) -> None:
    imports = report["imports"]
    present = imports["present"]
    assert "grpc" not in present["http only"]
    assert "grpc" in present["http + grpc"] and "httpx" in present["everything on"]
    for modules in present.values():
        # one TFLite model: neither ONNX Runtime nor OpenCV is imported
        assert "ai_edge_litert" in modules and "numpy" in modules
        assert "onnxruntime" not in modules and "cv2" not in modules
    assert imports["added_mb"]["numpy"] > 1
    assert imports["interpreter_mb"] < imports["total_mb"]


@pytest.mark.slow
def test_the_soak_answers_everything(report: dict[str, Any]) -> None:
    soak = report["soak"]
    assert soak["errors"] == 0, soak["error_samples"]
    assert soak["requests"] > 20 and soak["requests_per_s"] > 0
    assert soak["daemon_counted"] == soak["requests"]  # /metrics saw every request
    kinds = soak["by_kind"]
    # cloud only: offloaded to the gateway; sensitive: may not leave, so refused
    heavy = kinds["digits-heavy public"]
    assert heavy["sent"] > 0 and heavy["cloud"] >= 0.9 * heavy["sent"]
    assert heavy["cloud"] + heavy.get("device", 0) == heavy["sent"]  # else a degraded stand-in
    sensitive = kinds["digits-heavy sensitive"]
    assert sensitive["refused"] == sensitive["sent"] > 0
    light = kinds["digits-light sensitive"]
    assert light["device"] == light["sent"] > 0
    assert {key.split()[0] for key in soak["by_status"]} == {"http", "grpc"}
    assert soak["rss_start_mb"] > 0 and soak["rss_max_mb"] >= soak["rss_end_mb"] > 0
    assert len(soak["rss_samples"]) >= 3


@pytest.mark.slow
def test_the_report_is_json_and_prints_its_tables(report: dict[str, Any]) -> None:
    json.dumps(report)  # what --json writes
    text = format_service(report)
    for heading in ("1. local API overhead", "2. startup and idle RSS", "3. soak"):
        assert heading in text
    assert "what imports add to RSS" in text


@pytest.mark.slow
def test_a_soak_too_short_for_a_sample_under_load_still_reports(report: dict[str, Any]) -> None:
    """`python -m benchmarks service --soak-s 10` once crashed in its report: with samples
    only at the start and the end there is no growth "under load" to format."""
    soak = report["soak"]
    short = {
        **report,
        "soak": {
            **soak,
            "rss_samples": [soak["rss_samples"][0], soak["rss_samples"][-1]],
            "rss_growth_under_load_mb": None,
        },
    }
    text = format_service(short)
    assert "too short a soak for a sample under load" in text
