"""`python -m benchmarks offload` at a small size: a real gateway and a real echo server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from benchmarks.agent.grpc_echo import METHOD
from benchmarks.agent.offload import echo_server, format_offload


def test_the_echo_server_returns_the_bytes_it_got() -> None:
    with echo_server() as address, grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(METHOD)
        assert call(b"\x00hello\xff", timeout=10) == b"\x00hello\xff"
        with pytest.raises(grpc.RpcError) as caught:
            channel.unary_unary("/bench.Echo/Other")(b"", timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.slow
def test_the_offload_benchmark_measures_each_path_against_the_gateways_compute(
    tmp_path: Path,
) -> None:
    out = tmp_path / "offload.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "offload", "--profile", "raspberry-pi-5",
         "--requests", "30", "--json", str(out)],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "target: p50 within 1.5x the floor" in result.stdout
    report = json.loads(out.read_text())
    paths = report["paths"]
    assert set(paths) == {"echo", "transport", "agent"}
    # every measured transport and agent request was run by the gateway, once each
    assert report["gateway_runs"] == 2 * 30
    assert 0 < report["gateway_compute_ms"] < paths["transport"]["p50_ms"]
    floor = paths["echo"]["p50_ms"] + report["gateway_compute_ms"]
    assert report["floor_p50_ms"] == pytest.approx(floor, abs=1e-3)
    for name in ("transport", "agent"):
        assert report["ratios"][name] == pytest.approx(paths[name]["p50_ms"] / floor, abs=2e-3)
    assert report["meets_target"] == all(r <= 1.5 for r in report["ratios"].values())
    # the agent's own work, the network taken out, is a part of its round trip
    assert 0 < report["agent_own"]["p50_ms"] < paths["agent"]["p50_ms"] - paths["echo"]["p50_ms"]
    assert format_offload(report) in result.stdout
