"""``python -m benchmarks hybrid``: local-only, cloud-only and hybrid on the digits, and
the gateway killed halfway."""

from __future__ import annotations

import pytest

from benchmarks.agent.hybrid import run_hybrid
from edge_agent.profiles import ProfileStore
from tests.support.paths import MODELS, PROFILES


@pytest.mark.slow
def test_hybrid_benchmark_answers_everything_with_the_gateway_killed() -> None:
    report = run_hybrid(ProfileStore(PROFILES).get("generic-x86_64"), MODELS)
    setups = report["setups"]
    assert (
        setups["local-only"]["offloaded_share"] == 0
        and setups["cloud-only"]["offloaded_share"] == 1
    )
    assert 0 < setups["hybrid"]["offloaded_share"] <= 0.25
    assert setups["hybrid"]["accuracy"] >= setups["cloud-only"]["accuracy"] - 0.005
    outage = report["gateway_killed_halfway"]
    assert outage["errors"] == 0 and outage["answered"] == 360 and outage["degraded"] > 0
    assert outage["max_ms"] < report["deadline_ms"] + 150
