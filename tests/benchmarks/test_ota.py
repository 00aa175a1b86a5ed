"""`python -m benchmarks ota` at small sizes: a real gateway, real installs in fresh processes."""

from __future__ import annotations

import pytest

from benchmarks.agent.ota import format_ota, run_ota


@pytest.mark.slow
def test_the_ota_benchmark_installs_each_size_with_bounded_memory() -> None:
    report = run_ota(sizes=(2, 12))
    sizes = report["sizes"]
    assert [s["model_mb"] for s in sizes] == [2, 12]
    for size in sizes:
        assert size["install_mb_s"] > 0 and size["smoke_test_s"] > 0
        # the install path does not hold the model: well under the 12 MB one's size
        assert 0 <= size["install_peak_rss_increase_mb"] < 6, size
        assert 0 <= size["write_peak_rss_increase_mb"] <= size["install_peak_rss_increase_mb"]
    assert report["summary"]["rss_increase_spread_mb"] < 3
    assert "install MB/s" in format_ota(report)
