"""A small answer's head and body leave the gateway in one send."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from cloud_gateway.rest.coalesce import HeadHeld
from tests.support.gateway import GatewayHandle


class Recording:
    """A transport that records its writes."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False
        self.extra = {"peername": ("127.0.0.1", 1)}

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.extra.get(name, default)


def test_a_head_waits_for_its_body_and_leaves_with_it() -> None:
    async def run() -> None:
        inner = Recording()
        transport = HeadHeld(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
        transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        assert inner.writes == [] and transport.get_write_buffer_size() > 0
        transport.write(b"ok")
        assert inner.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]
        transport.write(b"more")  # not a head: at once
        assert inner.writes[-1] == b"more"
        assert transport.get_extra_info("peername") == ("127.0.0.1", 1)  # the rest is the inner's
        await asyncio.sleep(0)
        assert len(inner.writes) == 2  # nothing was held twice

    asyncio.run(run())


def test_a_head_alone_leaves_on_the_next_turn_and_before_closing() -> None:
    async def run() -> None:
        inner = Recording()
        transport = HeadHeld(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
        transport.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        assert inner.writes == []
        await asyncio.sleep(0)  # a head with no body (204) leaves on the loop's next turn
        assert inner.writes == [b"HTTP/1.1 204 No Content\r\n\r\n"]
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        transport.close()  # what is held is sent first
        assert inner.writes[-1] == b"HTTP/1.1 200 OK\r\n\r\n" and inner.closed
        await asyncio.sleep(0)
        assert len(inner.writes) == 2
        aborted = Recording()
        transport = HeadHeld(aborted, asyncio.get_running_loop())  # type: ignore[arg-type]
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        transport.abort()  # an abort drops it, as the transport drops its buffer
        await asyncio.sleep(0)
        assert aborted.writes == [] and aborted.aborted

    asyncio.run(run())


@pytest.mark.slow
def test_answers_through_it_are_whole_on_kept_alive_and_closed_connections(
    gateway: GatewayHandle,
) -> None:
    """Every answer arrives whole and in order: three on one kept-alive connection,
    then one asked with ``Connection: close`` (its head and body sent before the close)."""
    url = gateway.http_url if "://" in gateway.http_url else f"http://{gateway.http_url}"
    host, _, port = url.partition("://")[2].partition(":")
    request = (
        f"GET /v2/models/digits-light HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {gateway.device_token}\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        reader = connection.makefile("rb")
        for close in (False, False, False, True):
            extra = "Connection: close\r\n" if close else ""
            connection.sendall(f"{request}{extra}\r\n".encode())
            status = reader.readline()
            fields = {}
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                fields[name.strip().lower()] = value.strip()
            body = reader.read(int(fields["content-length"]))
            assert status.startswith(b"HTTP/1.1 200") and b'"digits-light"' in body
        assert reader.read() == b""  # closed after the last answer
