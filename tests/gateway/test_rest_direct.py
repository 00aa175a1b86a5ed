"""Inference requests answered on the connection (cloud_gateway.rest.direct): on raw
sockets, keep-alive, pipelining, early refusals, chunked and split bodies, and the
requests it leaves to uvicorn's ASGI path."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import cloud_gateway.rest.infer as infer_module
from cloud_gateway.config import ConnectionSettings
from cloud_gateway.rest.direct import DirectInferProtocol
from tests.support.backends import SlowBackend
from tests.support.gateway import GatewayHandle, start_gateway
from tests.support.gateway_calls import direct, heldout, metric, small_repository


@pytest.fixture
def handle(tmp_path: Path) -> Iterator[GatewayHandle]:
    gateway = start_gateway(
        tmp_path, small_repository(tmp_path), max_body_bytes=8192, poll_interval_s=0.0
    )
    yield gateway
    gateway.thread.stop()


def request(
    handle: GatewayHandle,
    body: bytes,
    *,
    token: str | None = None,
    path: str = "/v2/models/digits-light/infer",
    extra: str = "",
    length: bool = True,
) -> bytes:
    """One raw HTTP/1.1 request (keep-alive unless ``extra`` says otherwise)."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: gateway\r\n"
        f"Authorization: Bearer {token or handle.device_token}\r\n"
        "Content-Type: application/json\r\n" + extra
    )
    if length:
        head += f"Content-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + body


def infer_body(x: np.ndarray) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": list(x.shape),
                     "data": x.ravel().tolist()}]}
    ).encode()  # fmt: skip


class Reader:
    """Answers read off one connection, one at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError
        self.buffer += chunk

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        if lines[0].startswith("HTTP/1.1 100"):
            return self.answer()
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        size = int(headers["content-length"])
        while len(self.buffer) < size:
            self._fill()
        body, self.buffer = self.buffer[:size], self.buffer[size:]
        return int(lines[0].split()[1]), headers, body

    def closed(self) -> bool:
        try:
            self._fill()
        except EOFError:
            return True
        return False


def connect(handle: GatewayHandle) -> tuple[socket.socket, Reader]:
    host, port = handle.http_url.split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock, Reader(sock)


def probabilities(body: bytes) -> np.ndarray:
    output = json.loads(body)["outputs"][0]
    return np.array(output["data"], dtype=np.float32).reshape(output["shape"])


@pytest.fixture
def asgi_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ASGI path's inference fails: whatever still answers came the direct way."""

    async def broken(*args: object) -> object:
        raise RuntimeError("the ASGI path was taken")

    monkeypatch.setattr(infer_module, "run_infer", broken)


def test_inference_is_answered_on_the_connection_kept_alive(
    handle: GatewayHandle, asgi_broken: None
) -> None:
    assert issubclass(handle.gateway._http.config.http_protocol_class, DirectInferProtocol)  # type: ignore[union-attr]
    x = heldout(2)
    sock, reader = connect(handle)
    with sock:
        for rows in (x[:1], x):  # two requests, one connection
            sock.sendall(request(handle, infer_body(rows), extra="X-Request-Id: r-7\r\n"))
            status, headers, body = reader.answer()
            assert status == 200 and headers["x-request-id"] == "r-7"
            assert headers["content-type"] == "application/json" and "date" in headers
            assert np.allclose(probabilities(body), direct("digits-light", rows), atol=1e-6)
    assert metric(handle, "gateway_requests_total", protocol="http", status="ok") == 2


def test_pipelined_requests_are_answered_in_order(handle: GatewayHandle) -> None:
    """An inference request, a health check and another inference request in one
    send: the second and third wait behind the first and are answered in order."""
    x = heldout(3)
    health = b"GET /v2/health/ready HTTP/1.1\r\nHost: gateway\r\n\r\n"
    sock, reader = connect(handle)
    with sock:
        sock.sendall(
            request(handle, infer_body(x[:1])) + health + request(handle, infer_body(x[1:]))
        )
        first, second, third = reader.answer(), reader.answer(), reader.answer()
    assert [first[0], second[0], third[0]] == [200, 200, 200]
    assert np.allclose(probabilities(first[2]), direct("digits-light", x[:1]), atol=1e-6)
    assert b"outputs" not in second[2]
    assert np.allclose(probabilities(third[2]), direct("digits-light", x[1:]), atol=1e-6)


def test_refused_before_the_body_then_the_connection_goes_on(handle: GatewayHandle) -> None:
    """A wrong token, or a Content-Length over the limit, is answered once the headers
    are in; the body is read and dropped and the connection serves the next request."""
    x = heldout(1)
    sock, reader = connect(handle)
    with sock:
        sock.sendall(request(handle, infer_body(x), token="wrong"))
        status, headers, body = reader.answer()
        assert status == 401 and headers["www-authenticate"] == "Bearer"
        assert "token" in json.loads(body)["error"]
        too_big = request(handle, b"{", extra="")[:-1]  # headers only, then the body
        too_big = too_big.replace(b"Content-Length: 1", b"Content-Length: 9000")
        sock.sendall(too_big)
        status, _, body = reader.answer()  # answered with the body still to come
        assert status == 413 and "limit" in json.loads(body)["error"]
        sock.sendall(b" " * 9000)
        sock.sendall(request(handle, infer_body(x)))
        assert reader.answer()[0] == 200
    assert metric(handle, "gateway_request_failures_total", status="unauthenticated") == 1
    assert metric(handle, "gateway_request_failures_total", status="too_large") == 1


def test_a_chunked_body_past_the_limit_is_refused(handle: GatewayHandle) -> None:
    x = heldout(1)
    body = infer_body(x)
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:100], body[100:]))
    sock, reader = connect(handle)
    with sock:
        extra = "Transfer-Encoding: chunked\r\n"
        sock.sendall(request(handle, b"", extra=extra, length=False) + chunked + b"0\r\n\r\n")
        status, _, answer = reader.answer()
        assert status == 200
        assert np.allclose(probabilities(answer), direct("digits-light", x), atol=1e-6)
        big = b"%x\r\n%s\r\n" % (9000, b" " * 9000)
        sock.sendall(request(handle, b"", extra=extra, length=False) + big + b"0\r\n\r\n")
        assert reader.answer()[0] == 413


def test_a_body_in_pieces_and_connection_close(handle: GatewayHandle) -> None:
    x = heldout(1)
    message = request(handle, infer_body(x), extra="Connection: close\r\n")
    sock, reader = connect(handle)
    with sock:
        for start in range(0, len(message), 200):
            sock.sendall(message[start : start + 200])
            time.sleep(0.01)
        status, headers, body = reader.answer()
        assert status == 200 and headers["connection"] == "close"
        assert np.allclose(probabilities(body), direct("digits-light", x), atol=1e-6)
        assert reader.closed()


def test_what_it_leaves_to_the_asgi_path(handle: GatewayHandle, asgi_broken: None) -> None:
    """A request that expects 100-continue goes through uvicorn's cycle (here made to
    fail: a 500), as does any route but inference; inference itself still answers."""
    x = heldout(1)
    sock, reader = connect(handle)
    with sock:
        sock.sendall(request(handle, infer_body(x), extra="Expect: 100-continue\r\n"))
        assert reader.answer()[0] == 500
        sock.sendall(request(handle, infer_body(x)))
        assert reader.answer()[0] == 200
        sock.sendall(request(handle, b"{}", path="/v2/models/digits-light/ready"))
        assert reader.answer()[0] == 405  # FastAPI's: that route takes GET


def test_a_client_gone_during_its_body_is_counted(handle: GatewayHandle) -> None:
    sock, _ = connect(handle)
    with sock:
        sock.sendall(request(handle, infer_body(heldout(1)))[:-10])
        time.sleep(0.2)
    deadline = time.monotonic() + 5
    while metric(handle, "gateway_client_disconnects_total", protocol="http") < 1:
        assert time.monotonic() < deadline, "not counted"
        time.sleep(0.05)


# -- what an independent review found --------------------------------------------------------


def test_a_gateway_fault_is_a_500_and_the_connection_closed(
    handle: GatewayHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not the client's fault: a 500 (never the parser's 400), at headers time or while
    answering, and the connection closed, as uvicorn does for a failing application."""
    plane = handle.gateway.plane
    x = heldout(1)

    def broken_registry(token: object) -> object:
        raise RuntimeError("the state database is gone")

    monkeypatch.setattr(handle.gateway.registry, "authenticate", broken_registry)
    sock, reader = connect(handle)
    with sock:
        sock.sendall(request(handle, infer_body(x)))
        status, headers, body = reader.answer()
        assert (status, json.loads(body)) == (500, {"error": "internal error"})
        assert headers["connection"] == "close" and reader.closed()
    monkeypatch.undo()

    async def cancelled(*args: object, **kwargs: object) -> object:
        raise asyncio.CancelledError  # as a shutdown past its grace cancels the task

    monkeypatch.setattr(plane, "infer", cancelled)
    sock, reader = connect(handle)
    with sock:
        sock.sendall(request(handle, infer_body(x)))
        assert reader.answer()[0] == 500 and reader.closed()


def test_a_connection_whose_answers_back_up_goes_through_uvicorn(
    handle: GatewayHandle, asgi_broken: None
) -> None:
    """Once a connection's writes are paused (its client reads no answers), its next
    requests take uvicorn's cycle, which waits for the answers to drain, instead of
    answers piling up in the gateway (here the ASGI path fails: a 500 says it took it)."""
    body = request(handle, infer_body(heldout(1)))
    sock, reader = connect(handle)
    with sock:
        sock.sendall(body)
        assert reader.answer()[0] == 200
        (connection,) = handle.gateway.connections._open
        handle.thread.call(_paused(connection, True))  # as the transport's pause_writing()
        sock.sendall(body)
        assert reader.answer()[0] == 500
        handle.thread.call(_paused(connection, False))
        sock.sendall(body)
        assert reader.answer()[0] == 200


async def _paused(connection: DirectInferProtocol, paused: bool) -> None:
    connection.flow.write_paused = paused


@pytest.mark.slow
def test_a_body_still_coming_at_shutdown_is_answered_503(tmp_path: Path) -> None:
    gateway = start_gateway(tmp_path, small_repository(tmp_path), poll_interval_s=0.0)
    sock, reader = connect(gateway)
    with sock:
        sock.sendall(request(gateway, infer_body(heldout(1)))[:-10])
        time.sleep(0.2)
        started = time.monotonic()
        stopping = threading.Thread(target=gateway.thread.stop)
        stopping.start()
        status, _, body = reader.answer()
        assert status == 503 and "stopping" in json.loads(body)["error"]
        assert reader.closed()
        stopping.join()
        assert time.monotonic() - started < 4  # not held until the grace period ends


@pytest.mark.slow
def test_a_pipelined_request_being_answered_is_not_idle(tmp_path: Path) -> None:
    """The guard: when the first answer is out and uvicorn starts the queued request,
    the connection is answering, not waiting (its keep-alive timeout does not apply)."""
    limits = ConnectionSettings(keep_alive_timeout_s=0.5)
    gateway = start_gateway(
        tmp_path,
        small_repository(tmp_path),
        backend=SlowBackend(0.8),
        poll_interval_s=0.0,
        connections=limits,
    )
    try:
        x = heldout(2)
        sock, reader = connect(gateway)
        with sock:
            sock.sendall(request(gateway, infer_body(x[:1])) + request(gateway, infer_body(x[1:])))
            assert [reader.answer()[0], reader.answer()[0]] == [200, 200]
    finally:
        gateway.thread.stop()
