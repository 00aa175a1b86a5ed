"""Reading a request's body within a limit, for every REST route that takes one."""

from __future__ import annotations

from fastapi import Request

from edge_core.errors import PayloadTooLarge
from edge_core.protocol.types import parse_length

__all__ = ["read_body"]


async def read_body(request: Request, limit: int) -> bytes:
    """The body of ``request``, refused as soon as it is known to pass ``limit`` bytes
    (by its ``Content-Length``, or while it streams in, chunked or not).

    Raises:
        ProtocolError: a malformed ``Content-Length`` (a 400).
        PayloadTooLarge: more than ``limit`` bytes.
        starlette.requests.ClientDisconnect: the client went away before the end.
    """
    declared = request.headers.get("content-length")
    if declared is not None and parse_length(declared, "Content-Length") > limit:
        raise PayloadTooLarge(
            f"request body of {declared} bytes exceeds the limit of {limit} bytes"
        )
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
