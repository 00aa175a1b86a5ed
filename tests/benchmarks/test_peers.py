"""``python -m benchmarks peers``: its pure parts (cases, the summary and its table, what
a server cannot take), the peers' environments failing clearly, and the wide MLP tool.

The benchmark itself installs and runs Triton and MLServer: not part of ``make test``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.peers import PeerUnavailable
from benchmarks.peers.compare import (
    Case,
    Server,
    cases_for,
    format_peers,
    knows_busy_delay,
    summarize_peers,
)
from benchmarks.peers.envs import ensure_env, installed
from edge_core.manifest import load_package
from tests.support.paths import ROOT
from tools import make_wide_mlp


def test_cases_are_grpc_at_each_count_and_http_at_the_most() -> None:
    assert [c.label for c in cases_for([1, 64])] == [
        "gRPC, 1 client",
        "gRPC, 64 clients",
        "HTTP JSON, 64 clients",
        "HTTP binary, 64 clients",
    ]


def _server(extensions: tuple[str, ...]) -> Server:
    process: Any = None
    return Server("mlserver", process, 1, 2, 0.1, extensions, "mlserver 1.7.1")


def test_a_server_without_the_binary_extension_cannot_take_binary_http() -> None:
    binary, json_tensors, grpc = Case("http", 64), Case("http", 64, True), Case("grpc", 64)
    assert _server(()).cannot(binary) == "no binary tensor extension"
    assert _server(()).cannot(json_tensors) is None and _server(()).cannot(grpc) is None
    assert _server(("binary_tensor_data",)).cannot(binary) is None


def _entry(server: str, case: Case, rps: float, p99: float, errors: int = 0) -> dict[str, Any]:
    return {
        "server": server, "case": case.label, "protocol": case.protocol,
        "clients": case.clients, "json_tensors": case.json_tensors, "round": 0,
        "throughput_per_s": rps, "p99_ms": p99, "errors": errors,
    }  # fmt: skip


def _report() -> dict[str, Any]:
    one, many, js, binary = cases_for([1, 64])
    cases = [
        _entry("gateway", one, 400, 3), _entry("triton", one, 200, 8),
        _entry("mlserver", one, 250, 5),
        _entry("gateway", many, 2000, 45), _entry("triton", many, 2500, 40),
        _entry("mlserver", many, 1000, 90),
        _entry("gateway", js, 2000, 49), _entry("triton", js, 1600, 60),
        _entry("mlserver", js, 3000, 30, errors=5),  # errors: not counted as the best
        _entry("gateway", binary, 3000, 60), _entry("triton", binary, 2000, 50),
        {**_entry("mlserver", binary, 0, 0), "unsupported": "no binary tensor extension"},
    ]  # fmt: skip
    for case in cases:
        if "unsupported" in case:
            del case["throughput_per_s"], case["p99_ms"], case["errors"]
    return {
        "model": "wide-mlp", "variant": "onnx-fp32", "machine": {"cpus": 2},
        "threads": 1, "max_batch_size": 64, "client": "tritonclient",
        "seconds_per_case": 3, "rounds": 1,
        "servers": {
            "gateway": {"version": "g 1", "started_s": 1.0},
            "triton": {"version": "triton 2.51.0", "started_s": 4.0},
            "mlserver": {"version": "mlserver 1.7.1", "started_s": 2.0},
            "absent": {"skipped": "absent: the interpreter /nowhere is not installed here"},
        },
        "cases": cases,
    }  # fmt: skip


def test_summary_compares_with_the_best_peer_and_judges_the_targets() -> None:
    report = _report()
    summarize_peers(report)
    rows = report["summary"]["cases"]
    assert rows["gRPC, 1 client"]["best_peer"] == "mlserver"
    assert rows["gRPC, 1 client"]["ratio"] == 1.6 and rows["gRPC, 1 client"]["meets_target"]
    assert rows["gRPC, 64 clients"]["ratio"] == 0.8
    assert not rows["gRPC, 64 clients"]["meets_target"]  # below 1.05x
    # MLServer answered with errors: Triton is the best peer; 1.25x with p99 49 ms
    assert rows["HTTP JSON, 64 clients"]["best_peer"] == "triton"
    assert rows["HTTP JSON, 64 clients"]["meets_target"]
    # 1.5x but a p99 over 50 ms
    assert rows["HTTP binary, 64 clients"]["ratio"] == 1.5
    assert not rows["HTTP binary, 64 clients"]["meets_target"]
    assert rows["HTTP binary, 64 clients"]["servers"]["mlserver"] == {
        "unsupported": "no binary tensor extension"
    }
    assert report["summary"]["meets_target"] is False


def test_the_table_shows_every_server_and_says_what_was_skipped() -> None:
    report = _report()
    summarize_peers(report)
    text = format_peers(report)
    assert "gateway req/s (p99 ms)" in text and "Triton req/s" in text and "MLServer" in text
    assert "2,000 (45.0)" in text and "0.80x (Triton)" in text
    assert "fails (no binary tensor extension)" in text
    assert "3,000 (30.0), 5 errors" in text
    assert "absent: the interpreter /nowhere is not installed here" in text
    assert "gRPC, 64 clients: misses the target (>= 1.05x, p99 <= 50 ms)" in text


def test_the_cpu_a_request_took_is_summarized_and_shown_beside_the_rates() -> None:
    report = _report()
    for case in report["cases"]:  # two rounds of each measured case
        if "throughput_per_s" in case:
            case.update(server_cpu_us_per_request=600.0, client_cpu_us_per_request=300.0)
    again = [
        {**c, "round": 1, "server_cpu_us_per_request": 700.0, "client_cpu_us_per_request": 350.0}
        for c in report["cases"]
        if "throughput_per_s" in c
    ]
    report["cases"] += again
    summarize_peers(report)
    triton = report["summary"]["cases"]["gRPC, 64 clients"]["servers"]["triton"]
    assert triton["server_cpu_us_per_request"] == 650.0
    assert triton["client_cpu_us_per_request"] == 325.0
    text = format_peers(report)
    assert "the server's processes / the clients'" in text
    assert "650 / 325" in text
    # a report made before the figures were measured shows no such table
    old = _report()
    summarize_peers(old)
    assert "the server's processes" not in format_peers(old)


def test_a_baseline_from_before_busy_delay_runs_without_it(tmp_path: Path) -> None:
    assert knows_busy_delay(None)  # this code
    assert knows_busy_delay(ROOT)  # a checkout of it
    old = tmp_path / "old" / "cloud_gateway"
    old.mkdir(parents=True)
    (old / "config.py").write_text("max_queue_delay_us: int = 0\n")
    assert not knows_busy_delay(tmp_path / "old")  # it would refuse the field
    assert not knows_busy_delay(tmp_path / "nothing")


def test_a_missing_interpreter_is_a_clear_skip(tmp_path: Path) -> None:
    with pytest.raises(PeerUnavailable, match="/nowhere/python3 is not installed"):
        ensure_env("peer-x", ["nothing"], python="/nowhere/python3", cache=tmp_path)
    assert not installed("peer-x", tmp_path)


@pytest.mark.slow
def test_a_failed_install_says_why_and_leaves_no_marker(tmp_path: Path) -> None:
    # a requirement pip cannot read fails at once, without the network
    with pytest.raises(PeerUnavailable, match="pip install") as caught:
        ensure_env("peer-y", ["not a requirement!"], cache=tmp_path)
    assert "peer-y.install.log" in str(caught.value)
    assert not installed("peer-y", tmp_path)


def test_the_wide_mlp_is_deterministic_and_batch_independent(tmp_path: Path) -> None:
    import onnxruntime as ort

    assert make_wide_mlp.build_onnx(64, 2) == make_wide_mlp.build_onnx(64, 2)
    root = make_wide_mlp.write_package(tmp_path, width=64, depth=2)
    package = load_package(root)  # the manifest checks: the files and their digests
    golden = package.golden()
    x = next(iter(golden.inputs.values()))
    session = ort.InferenceSession(str(root / "model.fp32.onnx"))
    one = np.concatenate([session.run(None, {"pixels": x[i : i + 1]})[0] for i in range(len(x))])
    together = session.run(None, {"pixels": x})[0]
    np.testing.assert_allclose(together, one, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(together, next(iter(golden.outputs.values())), rtol=1e-5)
    assert together.shape == (len(x), 10)
    np.testing.assert_allclose(together.sum(axis=1), 1.0, rtol=1e-5)


def test_the_tool_runs_as_a_script(tmp_path: Path) -> None:
    root = ROOT
    done = subprocess.run(
        [sys.executable, str(root / "tools" / "make_wide_mlp.py"), "--out", str(tmp_path),
         "--width", "32", "--depth", "1"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "wide-mlp" / "1" / "manifest.json").is_file()


def test_the_figures_page_judges_p2b_from_the_summary() -> None:
    from benchmarks.targets import TARGETS, judge

    report = _report()
    summarize_peers(report)
    text, met = judge(next(t for t in TARGETS if t.id == "P2b"), report)
    assert "gRPC, 64 clients: 0.8x triton, p99 45.0 ms" in text
    assert met is False
