"""One send for a small answer: its head held until its body is written.

uvicorn writes an answer's status line and headers as soon as the application
starts the answer, and its body when the application sends it: two ``send()``
calls for a request that could take one, and the client woken twice (on a core
it shares, two switches to it and back). :class:`HeadHeld` wraps the connection's
transport and holds a write that ends like an HTTP head (``\\r\\n\\r\\n``) until
the next write, which then leaves with it, or until the event loop's next turn,
whichever comes first. The order of the bytes never changes and nothing waits
longer than one turn of the loop; closing the transport sends what is held first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

__all__ = ["HeadHeld"]

_HEAD_END = b"\r\n\r\n"


class HeadHeld:
    """An ``asyncio.Transport`` (every other attribute is the wrapped one's) whose
    writes that end an HTTP head wait for the next write, or for the loop's next turn."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is not None:
            data, self._held = self._held + bytes(data), None
            self._transport.write(data)
        elif bytes(data[-4:]) == _HEAD_END:
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def writelines(self, chunks: Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(chunks))

    def flush(self) -> None:
        """Send what is held, if anything."""
        if self._held is not None:
            held, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(held)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
