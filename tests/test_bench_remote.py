"""``cloud-gateway bench remote``'s summary: medians over rounds, and judged honestly."""

from __future__ import annotations

from typing import Any

import pytest

from cloud_gateway.bench_remote import _rounds, summarize_remote
from tools.bench_targets import _p10


def case(path: str, clients: int, rounds: int, per_s: float, p50: float) -> dict[str, Any]:
    return {"protocol": "http", "path": path, "clients": clients, "round": rounds,
            "throughput_per_s": per_s, "p50_ms": p50, "errors": 0}  # fmt: skip


def test_the_p50_added_is_the_median_of_each_rounds_difference() -> None:
    report: dict[str, Any] = {"cases": []}
    # the machine drifts: round 2 is slow on both paths, its difference is still 1 ms
    for r, (direct, through) in enumerate([(3.0, 3.6), (5.0, 6.0), (3.1, 3.8)]):
        report["cases"] += [case("direct", 1, r, 300, direct), case("gateway", 1, r, 250, through)]
        report["cases"] += [case("direct", 16, r, 400 - r, 50), case("gateway", 16, r, 380, 52)]
    summarize_remote(report)
    summary = report["summary"]["http"]
    assert summary["p50_added_ms"] == pytest.approx(0.7)  # of 0.6, 1.0, 0.7
    assert summary["direct_per_s"] == 399 and summary["gateway_per_s"] == 380
    assert summary["rounds"] == 3 and summary["meets_target"]


def test_an_engine_that_answered_nothing_is_all_lost_not_a_crash() -> None:
    report: dict[str, Any] = {"cases": [case("direct", 1, 0, 0, 0), case("gateway", 1, 0, 0, 0)]}
    summarize_remote(report)
    assert report["summary"]["http"]["throughput_loss"] == 1.0
    assert not report["summary"]["http"]["meets_target"]


def test_no_rounds_is_refused_and_an_empty_summary_is_not_met() -> None:
    assert _rounds("2") == 2
    with pytest.raises(Exception, match="at least 1"):
        _rounds("0")
    assert _p10({"engine": "e", "summary": {}})[1] is False
