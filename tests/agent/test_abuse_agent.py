"""The agent's local API under abuse (issue 11): `edge-agent run` as a child process
on loopback, attacked as a careless client or an attacker would, in bounded loops.
Every answer is JSON with a 4xx (or 503 when full, 504 when late), nothing grows
without bound, and other clients are served meanwhile."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException

from tests.support.daemon import Running, read_answers, start_agent
from tests.support.gateway import start_gateway
from tests.support.paths import MODELS

LIMITS = """max_connections = 4
idle_timeout_s = 0.6
request_timeout_s = 1.5
"""


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    running = start_agent(tmp_path_factory.mktemp("abuse"), api=LIMITS)
    running.wait_message("READY=1")
    yield running
    running.stop()


def body(rows: int = 1) -> dict[str, object]:
    return {
        "inputs": [
            {"name": "pixels", "shape": [rows, 64], "datatype": "FP32", "data": [0.0] * (64 * rows)}
        ]
    }


def request(
    agent: Running,
    method: str,
    path: str,
    payload: object = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, object]]:
    connection = http.client.HTTPConnection("127.0.0.1", agent.http_port, timeout=10)
    try:
        connection.request(
            method, path, json.dumps(payload) if payload is not None else None, headers or {}
        )
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def raw(agent: Running, data: bytes, answers: int = 1) -> str:
    with socket.create_connection(("127.0.0.1", agent.http_port), timeout=10) as sock:
        sock.sendall(data)
        return read_answers(sock, answers)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_unknown_names_grow_neither_memory_nor_metrics(tmp_path: Path) -> None:
    """With a gateway, a name the device does not have is offloaded and the gateway's
    404 passed on; the names are neither remembered nor labels of the metrics."""
    gateway = start_gateway(tmp_path / "gateway", MODELS, poll_interval_s=0.0)
    token = tmp_path / "device.token"
    token.write_text(gateway.device_token)
    token.chmod(0o600)
    extra = f'[gateway]\naddress = "{gateway.grpc_url}"\ntoken_file = "{token}"\n'
    running = start_agent(tmp_path / "agent", extra=extra)
    try:
        running.wait_message("READY=1")
        connection = http.client.HTTPConnection("127.0.0.1", running.http_port, timeout=10)

        def flood(count: int, offset: int) -> None:
            for index in range(count):
                name = f"unknown-{offset + index:06d}-" + "x" * 100
                connection.request("POST", f"/v2/models/{name}/infer", json.dumps(body()))
                response = connection.getresponse()
                assert response.status == 404, response.read()
                response.read()

        flood(300, 0)  # the caches and the metrics' one "unknown" label exist now
        metrics_before = len(running.get("/metrics")[1])
        rss_before = rss_kb(running.process.pid)
        flood(2000, 300)
        metrics_after = len(running.get("/metrics")[1])
        rss_after = rss_kb(running.process.pid)
        connection.close()
        # before: each name was a label (~300 bytes of /metrics each) and a cache entry
        assert metrics_after - metrics_before < 200, (metrics_before, metrics_after)
        assert rss_after - rss_before < 2048, (rss_before, rss_after)
        text = running.get("/metrics")[1].decode()
        assert 'model="unknown"' in text and "unknown-000" not in text
    finally:
        running.stop()
        gateway.thread.stop()


@pytest.mark.parametrize(
    ("name", "why"),
    [("x" * 10_000, "expected 1-128"), ("..", "without '..'"), ("a..b", "without '..'")],
)
def test_a_name_that_breaks_the_rule_is_a_400_before_any_lookup(
    agent: Running, name: str, why: str
) -> None:
    for method, path, payload in (
        ("POST", f"/v2/models/{name}/infer", body()),
        ("GET", f"/v2/models/{name}", None),
        ("GET", f"/v2/models/{name}/ready", None),
    ):
        status, document = request(agent, method, path, payload)
        assert status == 400, (path[:60], document)
        assert why in str(document["error"])
    assert agent.get("/v2/health/live")[0] == 200
    assert not [e for e in agent.logs() if e.get("level") == "error"], agent.stderr[-5:]


@pytest.mark.parametrize("version", ["-1", "0", "1e9", "0x10", "1" * 5000])
def test_a_malformed_version_is_a_400(agent: Running, version: str) -> None:
    base = f"/v2/models/digits-light/versions/{version}"
    for method, path, payload in (
        ("POST", f"{base}/infer", body()),
        ("GET", base, None),
        ("GET", f"{base}/ready", None),
    ):
        status, document = request(agent, method, path, payload)
        assert status == 400, (path[:80], document)
        assert "model version" in str(document["error"])


def test_a_version_the_device_does_not_have_is_a_404_and_its_own_is_served(
    agent: Running,
) -> None:
    for method, suffix, payload in (("POST", "/infer", body()), ("GET", "", None)):
        status, document = request(
            agent, method, f"/v2/models/digits-light/versions/99999{suffix}", payload
        )
        assert status == 404 and "no version 99999" in str(document["error"]), document
        status, document = request(
            agent, method, f"/v2/models/digits-light/versions/1{suffix}", payload
        )
        assert status == 200, document
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    with pytest.raises(InferenceServerException) as refused:
        client.get_model_metadata("digits-light", model_version="99999")
    assert refused.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as malformed:
        client.is_model_ready("digits-light", model_version="0x10")
    assert malformed.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException) as long_name:
        client.get_model_metadata("y" * 10_000)
    assert long_name.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert client.is_model_ready("digits-light", model_version="1")
    client.close()


def test_a_deadline_that_has_passed_is_a_504_on_both_protocols(agent: Running) -> None:
    late = {**body(), "parameters": {"timeout": 1}}
    status, document = request(agent, "POST", "/v2/models/digits-light/infer", late)
    assert status == 504 and "deadline" in str(document["error"]), document
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    x = tgrpc.InferInput("pixels", [1, 64], "FP32")
    x.set_data_from_numpy(np.zeros((1, 64), np.float32))
    with pytest.raises(InferenceServerException) as expired:  # the protocol's timeout, 1 µs
        client.infer("digits-light", [x], timeout=1)
    assert expired.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert "deadline passed" in expired.value.message()
    assert client.infer("digits-light", [x]).as_numpy("probabilities").shape == (1, 10)
    client.close()


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * 200 + b"\r\n", 431),
        (b"OPTIONS /v2 HTTP/1.1\r\nHost: x\r\n\r\n", 501),
        (b"GET /v2 HTTP/2.0\r\n\r\n", 505),
    ],
)
def test_the_servers_own_errors_are_json(agent: Running, data: bytes, status: int) -> None:
    answer = raw(agent, data)
    head, _, rest = answer.partition("\r\n\r\n")
    assert head.startswith((f"HTTP/1.1 {status}", f"HTTP/1.0 {status}")), answer
    assert "application/json" in head
    assert "error" in json.loads(rest)


@pytest.mark.slow
def test_a_chunked_body_is_read_within_the_limit(agent: Running) -> None:
    payload = json.dumps(body(2)).encode()
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(part), part) for part in (payload[:100], payload[100:])
    )
    answer = raw(
        agent,
        b"POST /v2/models/digits-light/infer HTTP/1.1\r\nHost: x\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n",
    )
    assert answer.startswith("HTTP/1.1 200"), answer[:300]
    big = b"POST /v2/models/digits-light/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    big += b"%x\r\n" % (17 * 1024 * 1024)
    answer = raw(agent, big)
    assert answer.startswith("HTTP/1.1 413") and "limit" in answer, answer[:300]


@pytest.mark.slow
def test_idle_and_trickling_connections_are_cut_and_others_served(agent: Running) -> None:
    """max_connections = 4: four idle ones fill it, a fifth is told 503 at once; the
    idle ones are closed after idle_timeout_s; one that trickles its headers a byte at
    a time is cut after request_timeout_s, while another client is served."""
    idle = [socket.create_connection(("127.0.0.1", agent.http_port), timeout=10) for _ in range(4)]
    time.sleep(0.1)  # accepted
    started = time.monotonic()
    answer = raw(agent, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith("HTTP/1.1 503") and "too many connections" in answer, answer
    assert time.monotonic() - started < 1.0
    for sock in idle:  # closed by the agent: the read sees the end
        assert sock.recv(1) == b""
        sock.close()
    assert agent.get("/v2/health/live")[0] == 200

    trickle = socket.create_connection(("127.0.0.1", agent.http_port), timeout=10)
    cut: list[bytes] = []

    def drip() -> None:
        try:
            for byte in b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: y\r\n" * 100:
                trickle.sendall(bytes([byte]))
                time.sleep(0.05)
        except OSError:
            pass
        cut.append(trickle.recv(65536))

    dripping = threading.Thread(target=drip)
    started = time.monotonic()
    dripping.start()
    served = [agent.get("/v2/health/live")[0] for _ in range(5)]
    dripping.join(10)
    assert served == [200] * 5
    assert cut and cut[0].startswith(b"HTTP/1.1 408"), cut
    assert time.monotonic() - started < 5  # 1.5 s allowed, not the 100 s it would drip
    trickle.close()


@pytest.mark.slow
def test_grpc_calls_beyond_the_bound_are_refused_not_queued(tmp_path: Path) -> None:
    running = start_agent(tmp_path, api="grpc_workers = 1\nmax_grpc_calls = 1\n")
    try:
        running.wait_message("READY=1")
        channel = grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}")
        from edge_core.protocol.grpc import pb

        ready = channel.unary_unary(
            "/inference.GRPCInferenceService/ServerReady",
            request_serializer=pb().ServerReadyRequest.SerializeToString,
            response_deserializer=pb().ServerReadyResponse.FromString,
        )
        results: list[object] = []

        def call() -> None:
            try:
                results.append(ready(pb().ServerReadyRequest(), timeout=10).ready)
            except grpc.RpcError as exc:
                results.append(exc.code())

        threads = [threading.Thread(target=call) for _ in range(32)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        assert True in results
        assert all(r is True or r == grpc.StatusCode.RESOURCE_EXHAUSTED for r in results), results
        channel.close()
    finally:
        running.stop()
