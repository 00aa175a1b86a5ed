"""Many stock gRPC clients in one process against a real gateway: none is refused
(issue 29, item 12).

Each client is a ``tritonclient.grpc.InferenceServerClient`` of its own, one a thread,
in a closed loop of batch-1 requests to the wide MLP (``tools/grpc_clients.py``). gRPC
gives the channels of one process with the same target and options one connection, so
64 or 256 clients are 64 or 256 calls at once on a single HTTP/2 connection: what the
per-connection stream limit sees. grpc counts a server's stream until the gateway has
released its call, a moment after the answer left, so the gateway holds more streams
than the client has open; with a limit of 100, some of 64 clients' calls and most of
256 clients' were refused (``UNAVAILABLE``, RST_STREAM REFUSED_STREAM).

A rapid-reset connection (calls opened and cancelled as fast as they can be written,
CVE-2023-44487) is the abuse that limit, counted that way, exists for: its calls past
the limit are refused, and the stock clients beside it keep being answered.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloud_gateway.config import BatchingSettings, ConnectionSettings
from tests.support.gateway import GatewayHandle, start_gateway
from tools import make_wide_mlp
from tools.grpc_clients import Load, closed_loop

LOAD_S = 3.0  # closed-loop load per case
PATIENCE = 60.0  # the most one call (or a thread's end) may take on a loaded machine


@pytest.fixture(scope="module")
def wide_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository with only the wide MLP (the issue's model, built in a second)."""
    root = tmp_path_factory.mktemp("wide-models")
    make_wide_mlp.write_package(root)
    return root


@pytest.fixture(scope="module", params=[0, 20000], ids=["default", "busy_delay_us=20000"])
def wide_gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, wide_models: Path
) -> Iterator[GatewayHandle]:
    """A gateway serving the wide MLP, with the default batching and with a busy delay."""
    batching = BatchingSettings(busy_delay_us=request.param)
    handle = start_gateway(
        tmp_path_factory.mktemp("gateway"), wide_models, batching=batching, poll_interval_s=0.0
    )
    yield handle
    handle.thread.stop()


def load(handle: GatewayHandle, clients: int, seconds: float) -> Load:
    return closed_loop(handle.grpc_url, handle.device_token, clients, seconds, patience=PATIENCE)


def assert_all_answered(result: Load) -> None:
    assert not result.failed, result.summary()
    assert not result.hung, result.summary()
    assert all(result.answered), "a client was never answered"


@pytest.mark.slow
@pytest.mark.parametrize("clients", [64, 256])
def test_stock_grpc_clients_on_one_connection_get_no_errors(
    wide_gateway: GatewayHandle, clients: int
) -> None:
    assert_all_answered(load(wide_gateway, clients, LOAD_S))


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def _literal(name: str, value: str) -> bytes:
    """One HPACK header field, literal and never indexed (no Huffman; short strings)."""
    raw_name, raw_value = name.encode(), value.encode()
    return b"\x10" + bytes([len(raw_name)]) + raw_name + bytes([len(raw_value)]) + raw_value


class RapidReset:
    """One raw HTTP/2 connection that opens ModelInfer calls and cancels each at once
    (HEADERS, then RST_STREAM CANCEL: the rapid-reset attack), reading what comes back."""

    def __init__(self, handle: GatewayHandle) -> None:
        host, port = handle.grpc_url.rsplit(":", 1)
        self.headers = b"".join(
            _literal(name, value)
            for name, value in [
                (":method", "POST"), (":scheme", "http"),
                (":path", "/inference.GRPCInferenceService/ModelInfer"),
                (":authority", handle.grpc_url), ("content-type", "application/grpc"),
                ("te", "trailers"), ("authorization", f"Bearer {handle.device_token}"),
            ]
        )  # fmt: skip
        self.sock = socket.create_connection((host, int(port)), timeout=PATIENCE)
        self.refused = 0  # RST_STREAM REFUSED_STREAM frames received
        self.sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0, b""))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buffer = b""
        with contextlib.suppress(OSError):
            while chunk := self.sock.recv(1 << 16):
                buffer += chunk
                while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                    size, kind, flags = int.from_bytes(buffer[:3], "big"), buffer[3], buffer[4]
                    if kind == 4 and not flags & 1:  # the server's SETTINGS: acknowledged
                        self.sock.sendall(_frame(4, 1, 0, b""))
                    if kind == 3 and buffer[9 : 9 + size] == struct.pack(">I", 7):
                        self.refused += 1
                    buffer = buffer[9 + size :]

    def run(self, seconds: float) -> int:
        """Open and cancel calls for ``seconds`` (or until the gateway closes the
        connection); how many."""
        stream, opened, end = 1, 0, time.monotonic() + seconds
        cancel = struct.pack(">I", 8)
        with contextlib.suppress(OSError):  # closed by the gateway: an answer too
            while time.monotonic() < end:
                burst = b"".join(
                    _frame(1, 4, i, self.headers) + _frame(3, 0, i, cancel)
                    for i in range(stream, stream + 200, 2)
                )
                self.sock.sendall(burst)
                stream, opened = stream + 200, opened + 100
        return opened

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._reader.join(timeout=PATIENCE)


@pytest.mark.slow
@pytest.mark.parametrize("streams", [None, 4096], ids=["default", "streams=4096"])
def test_a_rapid_reset_connection_is_refused_and_others_are_served(
    tmp_path: Path, wide_models: Path, streams: int | None
) -> None:
    """The clients beside a rapid-reset connection are answered, none cancelled: the
    calls it holds never fill grpc's queue of calls not yet taken, at the default
    stream limit (at grpc's own queue limits it cost them a call in a few hundred) or
    one an operator raised past those limits (it cost them most of their calls)."""
    connections = (
        ConnectionSettings()
        if streams is None
        else ConnectionSettings(grpc_max_concurrent_streams=streams)
    )
    handle = start_gateway(tmp_path, wide_models, poll_interval_s=0.0, connections=connections)
    attacker = RapidReset(handle)
    result: dict[str, Load] = {}
    honest = threading.Thread(
        target=lambda: result.update(honest=load(handle, 8, 2 * LOAD_S)), daemon=True
    )
    try:
        honest.start()
        opened = attacker.run(2 * LOAD_S)
        honest.join(timeout=2 * LOAD_S + 3 * PATIENCE)
    finally:
        attacker.close()
        handle.thread.stop()
    assert_all_answered(result["honest"])
    assert attacker.refused > 0, f"none of {opened} reset calls was refused"


@pytest.mark.parametrize("streams", [1, 100, 1000, 4096])
def test_the_queue_of_calls_not_yet_taken_holds_what_connections_may(streams: int) -> None:
    """Twice and four times what one connection holds, never below grpc's own limits:
    the queue is every connection's, and a low stream limit with many devices (64
    clients, one connection each, at a limit of 1) had 24,757 calls cancelled."""
    from cloud_gateway.server import _pending_call_limits

    limits = dict(_pending_call_limits(streams))
    assert limits["grpc.server.max_pending_requests"] == max(1000, 2 * streams)
    assert limits["grpc.server.max_pending_requests_hard_limit"] == max(3000, 4 * streams)
