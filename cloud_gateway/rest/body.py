"""Reading a request's body within a limit, for every REST route that takes one."""

from __future__ import annotations

from fastapi import Request
from starlette.requests import ClientDisconnect
from starlette.types import Receive

from edge_core.errors import PayloadTooLarge
from edge_core.protocol.types import parse_length

__all__ = ["check_declared", "check_received", "read_body", "receive_body"]


async def read_body(request: Request, limit: int) -> bytes:
    """The body of ``request`` (not read before), as :func:`receive_body` reads it."""
    return await receive_body(request.receive, request.headers.get("content-length"), limit)


def check_declared(declared: str | None, limit: int) -> None:
    """Refuse a body whose ``Content-Length`` (``declared``) passes ``limit`` bytes.

    Raises:
        ProtocolError: a malformed ``Content-Length`` (a 400).
        PayloadTooLarge: more than ``limit`` bytes.
    """
    if declared is not None and parse_length(declared, "Content-Length") > limit:
        raise PayloadTooLarge(
            f"request body of {declared} bytes exceeds the limit of {limit} bytes"
        )


def check_received(size: int, limit: int) -> None:
    """Refuse a body once ``size`` bytes of it, more than ``limit``, have come in.

    Raises:
        PayloadTooLarge: more than ``limit`` bytes.
    """
    if size > limit:
        raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")


async def receive_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """A request's body from its ASGI ``receive``, refused as soon as it is known to pass
    ``limit`` bytes (by its ``Content-Length``, ``declared``, or while it streams in,
    chunked or not).

    Raises:
        ProtocolError: a malformed ``Content-Length`` (a 400).
        PayloadTooLarge: more than ``limit`` bytes.
        starlette.requests.ClientDisconnect: the client went away before the end.
    """
    check_declared(declared, limit)
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        if message["type"] != "http.request":  # as Starlette's Request.stream(), skipped
            continue
        chunk = message.get("body", b"")
        size += len(chunk)
        check_received(size, limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
