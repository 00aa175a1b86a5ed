"""The load generator (`cloud-gateway bench`, and the benchmarks' clients): each client on
a connection of its own, as devices are."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from benchmarks.gateway.limits import load
from tests.support.gateway import GatewayHandle

ESTABLISHED = "01"


def connections_to(port: int) -> int:
    """Established TCP connections whose local port is ``port`` (the server's ends)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == ESTABLISHED and int(fields[1].rpartition(":")[2], 16) == port:
                count += 1
    return count


@pytest.mark.slow
@pytest.mark.parametrize("client", ["raw", "tritonclient"])
def test_each_grpc_client_has_its_own_connection(
    gateway: GatewayHandle, tmp_path: Path, client: str
) -> None:
    data = tmp_path / "input.npy"
    np.save(data, np.zeros((1, 64), np.float32))
    port = gateway.gateway.grpc_port
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:  # until the load ends, however long its start takes
        while not done.is_set() and max(seen, default=0) < 4:
            seen.append(connections_to(port))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = load(
            "grpc", gateway.grpc_url, "digits-light", gateway.device_token, data, 4, 2.0,
            client=client,
        )  # fmt: skip
    finally:
        done.set()
        watcher.join()
    assert result["errors"] == 0 and result["requests"] > 0
    # gRPC would otherwise put the four channels on one shared connection
    assert max(seen) == 4


def test_a_paired_run_alternates_and_takes_the_difference_within_each_pair(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One client, two servers in turn: the machine slows down halfway (every request
    twice as long), and the difference within each pair still says what the second
    server adds, where separate runs would mix it with the drift."""
    import asyncio

    from cloud_gateway import loadgen

    now = [0.0]
    monkeypatch.setattr(loadgen.time, "perf_counter", lambda: now[0])
    order: list[str] = []

    def server(name: str, ms: float) -> loadgen.Send:
        async def send() -> None:
            order.append(name)
            now[0] += ms / 1000 * (2 if now[0] > 0.5 else 1)

        return send

    first, second = asyncio.run(loadgen._paired(server("a", 3.0), server("b", 4.0), 1.0, []))
    assert order[:4] == ["a", "b", "b", "a"]  # the order alternates: no side always first
    assert len(first) == len(second) > 100
    added = np.median(np.subtract(second, first)) * 1000
    assert added == pytest.approx(1.0)  # most pairs ran before the slow-down
    differences = np.round(np.subtract(second, first) * 1000, 6)
    assert np.sum((differences != 1.0) & (differences != 2.0)) <= 1  # a pair across the change


@pytest.mark.slow
def test_a_paired_run_against_a_gateway_reports_both_paths(
    gateway: GatewayHandle, tmp_path: Path
) -> None:
    data = tmp_path / "input.npy"
    np.save(data, np.zeros((1, 64), np.float32))
    result = load(
        "http", gateway.http_url, "digits-light", gateway.device_token, data, 1, 1.0,
        extra=("--pair-url", gateway.http_url),
    )  # fmt: skip
    assert result["errors"] == 0 and result["requests"] == result["pair"]["requests"] > 0
    assert {"p50_ms", "p99_ms", "throughput_per_s"} <= result["pair"].keys()
    assert isinstance(result["added_p50_ms"], float)


def test_a_paired_run_is_one_client(tmp_path: Path) -> None:
    import subprocess
    import sys

    answer = subprocess.run(
        [sys.executable, "-m", "cloud_gateway.loadgen", "--protocol", "http", "--url", "x",
         "--model", "m", "--token", "t", "--data", "d", "--concurrency", "2",
         "--pair-url", "y"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert answer.returncode == 2 and "--concurrency 1" in answer.stderr


@pytest.mark.slow
def test_a_run_reports_the_cpu_a_request_took(gateway: GatewayHandle, tmp_path: Path) -> None:
    import os

    data = tmp_path / "input.npy"
    np.save(data, np.zeros((1, 64), np.float32))
    result = load(
        "grpc", gateway.grpc_url, "digits-light", gateway.device_token, data, 2, 1.0,
        extra=("--cpu-of", str(os.getpid())),  # the gateway runs in this process
    )  # fmt: skip
    assert result["errors"] == 0 and result["requests"] > 0
    assert result["client_cpu_us_per_request"] > 0
    # this process's tree holds the clients too: at least what they took
    assert result["server_cpu_us_per_request"] >= result["client_cpu_us_per_request"]
    without = load("grpc", gateway.grpc_url, "digits-light", gateway.device_token, data, 1, 0.5)
    assert "server_cpu_us_per_request" not in without and "client_cpu_us_per_request" in without


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_cloud_gateway_bench_loads_a_running_gateway(
    gateway: GatewayHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str], protocol: str
) -> None:
    from cloud_gateway.cli import main

    out = tmp_path / "load.json"
    url = gateway.grpc_url if protocol == "grpc" else gateway.http_url
    code = main(
        ["bench", "--url", url, "--protocol", protocol, "--model", "digits-light",
         "--token", gateway.device_token, "--concurrency", "1,3", "--seconds", "0.3",
         "--warmup", "0.1", "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text())
    # the input's name and shape come from the gateway's metadata: zeros of one row
    assert report["input"] == {"name": "pixels", "shape": [1, 64], "zeros": True}
    assert [c["clients"] for c in report["cases"]] == [1, 3]
    assert all(c["errors"] == 0 and c["requests"] > 0 for c in report["cases"])
    assert all(0 < c["p50_ms"] <= c["p99_ms"] for c in report["cases"])
    table = capsys.readouterr().out
    assert f"digits-light at {url} over {protocol}" in table and "req/s" in table


def test_cloud_gateway_bench_says_what_it_cannot_measure(
    gateway: GatewayHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cloud_gateway.cli import main

    common = ["--url", gateway.http_url, "--protocol", "http", "--seconds", "0.1"]
    assert main(["bench", *common, "--model", "nope", "--token", gateway.device_token]) == 1
    assert "the metadata of 'nope'" in capsys.readouterr().err
    grpc = ["--url", gateway.grpc_url, "--model", "digits-light", "--token", "wrong"]
    assert main(["bench", *grpc, "--seconds", "0.1"]) == 1
    assert capsys.readouterr().err.endswith(": UNAUTHENTICATED: invalid token\n")
    wrong = tmp_path / "row.npy"
    np.save(wrong, np.zeros((1, 3), np.float32))
    args = ["--model", "digits-light", "--token", gateway.device_token, "--data", str(wrong)]
    assert main(["bench", *common, *args]) == 1
    assert "a row of shape [1, 3], the model takes [1, 64]" in capsys.readouterr().err
    assert (
        main(["bench", *common, "--model", "digits-light", "--token", "t", "--concurrency", "0"])
        == 1
    )
    assert "--concurrency wants client counts of at least 1" in capsys.readouterr().err


class NeverAnswers(BaseHTTPRequestHandler):
    """A server that describes a model and never answers an inference request."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = json.dumps(
            {
                "name": "m",
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.stop.wait(60)  # type: ignore[attr-defined]

    def log_message(self, *args: object) -> None:
        pass


def test_cloud_gateway_bench_ends_when_no_answer_comes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A request waits at most --timeout for its answer, then its client stops: the
    run ends, says so, and fails (it had waited for ever)."""
    from cloud_gateway.cli import main

    server = ThreadingHTTPServer(("127.0.0.1", 0), NeverAnswers)
    server.daemon_threads = True
    server.stop = threading.Event()  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"127.0.0.1:{server.server_address[1]}"
    started = time.monotonic()
    try:
        code = main(
            ["bench", "--url", url, "--protocol", "http", "--model", "m", "--token", "t",
             "--concurrency", "2", "--seconds", "0.2", "--warmup", "0", "--timeout", "0.5"]
        )  # fmt: skip
    finally:
        server.stop.set()  # type: ignore[attr-defined]
        server.shutdown()
    assert time.monotonic() - started < 10
    assert code == 1
    out = capsys.readouterr().out
    assert "errors" in out


def test_cloud_gateway_bench_refuses_what_it_cannot_load_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A TLS address is refused up front (the clients speak plain HTTP and gRPC)."""
    from cloud_gateway.cli import main

    args = ["bench", "--url", "https://127.0.0.1:1", "--model", "m", "--token", "t"]
    assert main(args) == 1
    assert "plain HTTP and gRPC only" in capsys.readouterr().err
