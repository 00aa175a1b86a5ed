"""``python -m benchmarks remote``'s summary (medians over rounds, judged honestly) and
its bare gRPC relay (the floor of a gRPC hop)."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gateway.remote import (
    _paired_cases,
    _relay,
    _rounds,
    format_remote,
    summarize_remote,
)
from benchmarks.targets import _p10
from edge_core.processes import stop_process


def case(path: str, clients: int, rounds: int, per_s: float, p50: float) -> dict[str, Any]:
    return {"protocol": "http", "path": path, "clients": clients, "round": rounds,
            "throughput_per_s": per_s, "p50_ms": p50, "p99_ms": 2 * p50, "errors": 0}  # fmt: skip


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


def test_the_throughput_lost_is_the_median_of_each_rounds_loss() -> None:
    """One round where the machine slowed the engine's straight run: the medians of the
    two paths would say 19% lost; judged round by round, none is."""
    report: dict[str, Any] = {"cases": []}
    for r, (direct, through) in enumerate([(247.0, 200.9), (191.1, 192.9), (265.9, 267.5)]):
        report["cases"] += [case("direct", 1, r, 300, 3.0), case("gateway", 1, r, 250, 3.5)]
        report["cases"] += [case("direct", 16, r, direct, 50), case("gateway", 16, r, through, 52)]
    summarize_remote(report)
    summary = report["summary"]["http"]
    assert summary["direct_per_s"] == 247.0 and summary["gateway_per_s"] == 200.9
    assert summary["throughput_loss"] == pytest.approx(-0.006, abs=1e-3)  # of 18.7, -0.9, -0.6%
    assert summary["meets_target"]


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


def test_the_relay_floor_is_the_median_of_each_rounds_difference() -> None:
    report: dict[str, Any] = {"cases": [], "engine": "e", "model": "m"}
    for r, (direct, relay, through) in enumerate(
        [(3.0, 3.9, 4.2), (5.0, 6.5, 6.9), (3.1, 4.0, 4.6)]
    ):
        report["cases"] += [case("direct", 1, r, 300, direct), case("relay", 1, r, 280, relay)]
        report["cases"] += [case("gateway", 1, r, 250, through)]
        report["cases"] += [case("direct", 16, r, 400, 50), case("gateway", 16, r, 380, 52)]
    summarize_remote(report)
    summary = report["summary"]["http"]
    assert summary["relay_p50_added_ms"] == pytest.approx(0.9)  # of 0.9, 1.5, 0.9
    assert summary["p50_added_ms"] == pytest.approx(1.5)  # of 1.2, 1.9, 1.5
    report["machine"] = {"cpus": 2}
    assert "the gateway's own work +0.60 ms beyond it" in format_remote(report)
    assert "(a bare relay alone +0.90 ms)" in _p10(report)[0]


def test_paired_runs_judge_the_difference_within_their_pairs() -> None:
    """With one client the direct path and each other path run in turn: the p50 added
    is the median over rounds of each run's median difference within its pairs, not
    the difference of the two p50s."""
    report: dict[str, Any] = {"cases": [], "engine": "e", "model": "m"}
    for r, (relay, through) in enumerate([(0.5, 0.9), (0.7, 1.4), (0.6, 0.8)]):
        at = {"protocol": "http", "clients": 1, "round": r}
        for path, added in (("relay", relay), ("gateway", through)):
            result = {"errors": 0, "throughput_per_s": 250, "p50_ms": 3.0, "p99_ms": 6.0,
                      "pair": {"throughput_per_s": 200, "p50_ms": 9.0, "p99_ms": 12.0},
                      "added_p50_ms": added}  # fmt: skip
            report["cases"] += _paired_cases(at, path, result)
        report["cases"] += [case("direct", 16, r, 400, 50), case("gateway", 16, r, 380, 52)]
    summarize_remote(report)
    summary = report["summary"]["http"]
    assert summary["p50_added_ms"] == pytest.approx(0.9)  # of 0.9, 1.4, 0.8; not 9 - 3
    assert summary["relay_p50_added_ms"] == pytest.approx(0.6)
    assert summary["rounds"] == 3 and summary["meets_target"]
    paired = [c for c in report["cases"] if c.get("pair")]
    assert {c["pair"] for c in paired} == {"relay", "gateway"} and len(paired) == 6
    report["machine"] = {"cpus": 2}
    assert "direct (in turn with gateway)" in format_remote(report)


def test_a_paired_run_that_measured_nothing_is_not_met() -> None:
    """An engine that answered no pair: no p50 added (not a 0), and the target missed."""
    report: dict[str, Any] = {"cases": []}
    empty = {"errors": 40, "requests": 0, "throughput_per_s": 0.0, "p50_ms": 0.0,
             "p99_ms": 0.0, "pair": {"throughput_per_s": 0.0, "p50_ms": 0.0, "p99_ms": 0.0},
             "added_p50_ms": None}  # fmt: skip
    report["cases"] += _paired_cases(
        {"protocol": "http", "clients": 1, "round": 0}, "gateway", empty
    )
    report["cases"] += [case("direct", 16, 0, 400, 50), case("gateway", 16, 0, 380, 52)]
    summarize_remote(report)
    assert report["summary"]["http"]["p50_added_ms"] == float("inf")
    assert not report["summary"]["http"]["meets_target"]
    assert report["summary"]["http"]["errors"] == 40  # counted once, not per side


def test_one_client_count_alone_is_judged_on_its_paired_runs() -> None:
    """``--clients 1``: the paired runs are also the throughput cases."""
    report: dict[str, Any] = {"cases": []}
    result = {"errors": 0, "throughput_per_s": 250, "p50_ms": 3.0, "p99_ms": 6.0,
              "pair": {"throughput_per_s": 240, "p50_ms": 3.5, "p99_ms": 7.0},
              "added_p50_ms": 0.5}  # fmt: skip
    report["cases"] += _paired_cases(
        {"protocol": "http", "clients": 1, "round": 0}, "gateway", result
    )
    summarize_remote(report)
    summary = report["summary"]["http"]
    assert (summary["direct_per_s"], summary["gateway_per_s"], summary["p50_added_ms"]) == (
        250,
        240,
        0.5,
    )


def test_the_bare_relay_forwards_bytes_metadata_deadline_and_status(tmp_path: Path) -> None:
    """What the relay adds is a gRPC hop and nothing else: what the engine got and said
    arrives unchanged, its errors too."""
    import grpc

    seen: list[tuple[bytes, str, float | None]] = []

    def infer(request: bytes, context: Any) -> bytes:
        token = dict(context.invocation_metadata()).get("authorization", "")
        seen.append((request, token, context.time_remaining()))
        if request == b"missing":
            context.abort(grpc.StatusCode.NOT_FOUND, "no such model")
        return request[::-1]

    engine = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelInfer": grpc.unary_unary_rpc_method_handler(infer)}
    )
    engine.add_generic_rpc_handlers((handler,))
    port = engine.add_insecure_port("127.0.0.1:0")
    engine.start()
    relay, address = _relay(f"127.0.0.1:{port}", tmp_path)
    try:
        with grpc.insecure_channel(address) as channel:
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            answer = call(b"\x01\x02\x03", timeout=5, metadata=(("authorization", "Bearer t"),))
            assert answer == b"\x03\x02\x01"
            ((request, token, remaining),) = seen
            assert request == b"\x01\x02\x03" and token == "Bearer t"
            # the deadline travelled; gRPC converts it between clocks and writes its
            # timeout header again at each hop: a few ms over 5 s can arrive (CI: 5.009)
            assert remaining is not None and 3 < remaining <= 5.1
            with pytest.raises(grpc.RpcError) as error:
                call(b"missing", timeout=5)
            assert error.value.code() == grpc.StatusCode.NOT_FOUND
            assert error.value.details() == "no such model"
    finally:
        stop_process(relay)
        engine.stop(0)
