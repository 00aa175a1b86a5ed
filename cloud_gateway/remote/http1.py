"""A small HTTP/1.1 client on asyncio streams, for the remote backend's HTTP engines.

Why not httpx: its pool and its models of requests and responses cost several times
the forwarded request's own CPU (docs/benchmarks/index.md, "A remote engine"), and an
engine speaks a narrow HTTP: a few request shapes, answers with ``Content-Length`` (or
chunked), keep-alive. So this client does only that:

- a pool of at most ``size`` keep-alive connections (the engine's
  ``max_in_flight``), opened as needed; a connection idle longer than
  ``idle_s`` is closed rather than reused (it may be closing at the engine's end),
  and a reused one that fails before any byte of an answer is tried once more on a
  fresh connection;
- one timeout for the whole exchange (connect, write, read);
- answers of at most ``max_bytes``; headers of at most 64 KiB.

Errors are :class:`Unreachable` (connecting failed, or the connection broke),
:class:`TimedOut` and :class:`Malformed`; the engine module translates them.
"""

from __future__ import annotations

import asyncio
import ssl
import sys
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

__all__ = ["Answer", "Client", "Malformed", "TimedOut", "Unreachable"]

MAX_HEADER_BYTES = 64 * 1024

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout: float) -> T:
    """``awaitable``'s result, or :class:`TimeoutError` after ``timeout`` seconds. On
    Python 3.11 and later, in the caller's own task (``asyncio.timeout``):
    ``asyncio.wait_for`` runs a coroutine in a task of its own, a task and its loop
    turns more for every request."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):
            return await awaitable
    return await asyncio.wait_for(awaitable, timeout)  # pragma: no cover - Python 3.10


class Unreachable(Exception):
    """The connection could not be made, or broke before the answer was in."""


class TimedOut(Exception):
    """No whole answer within the timeout."""


class Malformed(Exception):
    """The answer is not HTTP/1.1 this client reads."""


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    used: float

    def close(self) -> None:
        self.writer.close()


class Client:
    def __init__(
        self,
        base_url: str,
        *,
        size: int,
        headers: dict[str, str] | None = None,
        context: ssl.SSLContext | None = None,
        connect_timeout: float = 2.0,
        idle_s: float = 2.0,
        max_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        url = urlsplit(base_url)
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.tls = context if context is not None else (
            ssl.create_default_context() if url.scheme == "https" else None
        )  # fmt: skip
        self.prefix = url.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.fixed = f"Host: {host}:{self.port}\r\n" + "".join(
            f"{name}: {value}\r\n" for name, value in (headers or {}).items()
        )
        self.connect_timeout = connect_timeout
        self.idle_s = idle_s
        self.max_bytes = max_bytes
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(size)

    async def _connect(self) -> _Connection:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self.tls, limit=MAX_HEADER_BYTES),
                self.connect_timeout,
            )
        except asyncio.TimeoutError:
            raise Unreachable(f"cannot connect to {self.host}:{self.port} in time") from None
        except OSError as exc:
            raise Unreachable(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        return _Connection(reader, writer, time.monotonic())

    def _reusable(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if now - connection.used < self.idle_s and not connection.reader.at_eof():
                return connection
            connection.close()
        return None

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | memoryview | Sequence[bytes | memoryview] = b"",
        headers: dict[str, str] | None = None,
        timeout: float,
    ) -> Answer:
        """One request; its answer, whatever the status. ``body``: bytes, or its parts
        (written as they are, not joined here first).

        Raises:
            Unreachable, TimedOut, Malformed.
        """
        parts = (body,) if isinstance(body, (bytes, bytearray, memoryview)) else tuple(body)
        size = sum(memoryview(part).nbytes for part in parts)
        head = (
            f"{method} {self.prefix}{path} HTTP/1.1\r\n{self.fixed}"
            + "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
            + f"Content-Length: {size}\r\n\r\n"
        ).encode("latin-1")
        try:
            async with self._slots:
                return await within(self._exchange((head, *parts)), timeout)
        except (TimeoutError, asyncio.TimeoutError):
            raise TimedOut(f"no answer within {timeout:.3f} s") from None

    async def _exchange(self, message: tuple[bytes | memoryview, ...]) -> Answer:
        connection = self._reusable()
        fresh = connection is None
        if connection is None:
            connection = await self._connect()
        while True:
            try:
                answer, keep = await self._send(connection, message)
            except _Stale:
                connection.close()
                if fresh:
                    raise Unreachable(
                        "the engine closed the connection without answering"
                    ) from None
                connection, fresh = await self._connect(), True  # once, on a fresh one
                continue
            except BaseException:
                connection.close()  # half an exchange: the connection cannot be reused
                raise
            if keep:
                connection.used = time.monotonic()
                self._idle.append(connection)
            else:
                connection.close()
            return answer

    async def _send(
        self, connection: _Connection, message: tuple[bytes | memoryview, ...]
    ) -> tuple[Answer, bool]:
        reader = connection.reader
        try:
            connection.writer.writelines(message)
            await connection.writer.drain()
            line = await reader.readline()
        except (ConnectionError, OSError) as exc:
            raise _Stale from exc
        if not line:
            raise _Stale
        try:
            version, status_text = line.decode("latin-1").split(" ", 2)[:2]
            status = int(status_text)
            headers: dict[str, str] = {}
            while True:
                field = await reader.readline()
                if field in (b"\r\n", b"\n"):
                    break
                if not field:
                    raise Unreachable("the connection broke in the answer's headers")
                name, _, value = field.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            if headers.get("transfer-encoding", "").lower() == "chunked":
                body = await self._chunked(reader)
            else:
                length = int(headers.get("content-length", "0"))
                if length > self.max_bytes:
                    raise Malformed(f"an answer of {length} bytes")
                body = await reader.readexactly(length)
        except (ValueError, asyncio.LimitOverrunError) as exc:
            raise Malformed(f"not an HTTP/1.1 answer: {line[:80]!r}") from exc
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            raise Unreachable(f"the connection broke in the answer: {exc!r}") from exc
        keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        return Answer(status, headers, body), keep

    async def _chunked(self, reader: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:  # then trailers, counted against the same bound, to a blank line
                while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    total += len(line)
                    if total > self.max_bytes:
                        raise Malformed(f"an answer of more than {self.max_bytes} bytes")
                return b"".join(parts)
            total += size
            if total > self.max_bytes:
                raise Malformed(f"an answer of more than {self.max_bytes} bytes")
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)

    async def close(self) -> None:
        while self._idle:
            self._idle.pop().close()


class _Stale(Exception):
    """A connection that gave no byte of an answer (closed at the engine's end)."""
