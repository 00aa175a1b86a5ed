"""The REST front end's connections: their timeouts, their number, and running out
of descriptors.

(Over 400 lines: one subclass of uvicorn's protocol and the accept loop's guard, whose
limits interlock.)

uvicorn times a connection out only once it has answered a request and waits
for the next one (its keep-alive timeout, reset by any byte): a connection
that never sends a byte, or trickles its headers or its body, is held for
ever, and nothing caps how many there are. Under a descriptor limit they end
up holding every descriptor, and asyncio's accept loop (CPython 3.11,
gh-151615) then retries ``accept()`` up to the backlog (2,048) times per
wake-up with a traceback each time: a core spinning, megabytes of log a
second, and no client served. Here, on uvicorn's httptools protocol (the
guard needs the parser's events, which an ASGI middleware never sees):

- each connection is in one phase with one deadline: waiting for a request
  (``keep_alive_timeout_s``, from its connection or its last answer; closed
  quietly), receiving the request's headers (``header_timeout_s`` from their
  first byte, at most ``max_header_bytes``), receiving its body
  (``body_timeout_s``), or being answered (no deadline: the gateway is the one
  working). A request cut short answers 408 (431 for headers too large, counted
  by reads and, for a head that comes whole in one read, as the parser reads it)
  in JSON before the connection closes, lingering: shut for sending, it reads and
  drops what the client still sends for a while, so that the client reads its
  answer rather than a reset;
- at most ``cap`` connections are open (:func:`connection_cap`: a share of the
  process's descriptor limit). One more closes the connection that has waited
  longest for a request or for the end of its headers, so idle and slow
  clients cannot lock the others out; when every connection is busy with a
  request, the newcomer is answered 503 and closed;
- the listening socket (:class:`Listener`) lets asyncio's own back-off (a
  second without accepting) happen once per burst instead of 2,048 times; each
  one is counted, logged at most once a minute without a traceback
  (:func:`install_exhaustion_handler`), and closes the longest-waiting idle
  connections to give descriptors back.

Client-caused lines of uvicorn's log (a malformed request, an unsupported
upgrade) are thinned the same way (:class:`ThrottleFilter`).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import resource
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from cloud_gateway.config import ConnectionSettings
from cloud_gateway.metrics import GatewayMetrics
from cloud_gateway.rest.coalesce import HeadHeld

__all__ = [
    "RESERVED_DESCRIPTORS",
    "ConnectionTracker",
    "GuardedHttpProtocol",
    "Listener",
    "ThrottleFilter",
    "connection_cap",
    "descriptor_limit",
    "install_exhaustion_handler",
    "raise_descriptor_limit",
]

log = logging.getLogger(__name__)

# what the process holds besides client connections: listeners, the event loop's
# and gRPC's pollers and wake-up descriptors, the state database, the log, the MQTT
# link, a model file being loaded (measured at idle: ~30)
RESERVED_DESCRIPTORS = 64
ACCEPT_MESSAGE = "socket.accept() out of system resource"  # asyncio's
EXHAUSTED_LINE = "out of descriptors accepting REST connections"  # ours
_EXHAUSTED = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_ACCEPT_PAUSE_S = 0.5  # asyncio waits 1 s before accepting again: the rest of a burst is quiet
LOG_INTERVAL_S = 60.0

IDLE = "idle"  # waiting for a request: fresh, or answered and kept alive
HEADERS = "headers"  # a request has begun; its headers are not all in
BODY = "body"  # the headers are in, the body is not
ANSWERING = "answering"  # the request is in; the gateway is working on it
CLOSING = "closing"  # answered and shut for sending; what still comes is dropped
LINGER_S = 2.0  # a closing connection reads and drops for this long at most,
LINGER_BYTES = 16 * 1024 * 1024  # and this much: then it is closed, whatever comes


def descriptor_limit() -> int | None:
    """The process's soft limit on open descriptors (``None``: unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def connection_cap(max_connections: int, limit: int | None) -> int:
    """The connections each front end (REST, gRPC) may hold: ``max_connections``, or
    less where the descriptor limit says so. Pure.

    Each front end gets a third of what the reserve leaves, as a REST connection
    can hold a second descriptor while it sends a file (an update blob).
    """
    if limit is None:
        return max_connections
    return max(1, min(max_connections, (limit - RESERVED_DESCRIPTORS) // 3))


def raise_descriptor_limit(wanted: int) -> int | None:
    """Raise the soft descriptor limit towards ``wanted`` (never past the hard limit,
    never down); the soft limit after it (``None``: unlimited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return descriptor_limit()


def _json_response(
    status: int, message: str, default_headers: Iterable[tuple[bytes, bytes]] = ()
) -> bytes:
    body = json.dumps({"error": message}).encode()
    head = [STATUS_LINE[status]]
    for name, value in default_headers:
        head.append(name + b": " + value + b"\r\n")
    head.append(b"content-type: application/json\r\n")
    head.append(b"content-length: %d\r\n" % len(body))
    head.append(b"connection: close\r\n\r\n")
    return b"".join(head) + body


class ThrottleFilter(logging.Filter):
    """Lets through at most one record a ``interval_s`` of each message that starts
    with one of ``prefixes`` (the next one says how many were held back), without
    its traceback; other records pass untouched."""

    def __init__(
        self,
        prefixes: Iterable[str],
        interval_s: float = LOG_INTERVAL_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.prefixes = tuple(prefixes)
        self.interval_s = interval_s
        self._clock = clock
        self._next: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        prefix = next((p for p in self.prefixes if text.startswith(p)), None)
        if prefix is None:
            return True
        now = self._clock()
        if now < self._next.get(prefix, float("-inf")):
            self._held[prefix] = self._held.get(prefix, 0) + 1
            return False
        held = self._held.pop(prefix, 0)
        self._next[prefix] = now + self.interval_s
        record.msg = f"{record.getMessage()} (logged at most once every {self.interval_s:g} s"
        record.msg += f"; {held} more since the last)" if held else ")"
        record.args = None
        record.exc_info = record.exc_text = None
        return True


log.addFilter(ThrottleFilter([EXHAUSTED_LINE]))


class ConnectionTracker:
    """The open REST connections of one gateway: their number against the cap, and
    the choice of whom to close when a new one needs room."""

    def __init__(
        self,
        settings: ConnectionSettings,
        cap: int,
        metrics: GatewayMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.cap = cap
        self.metrics = metrics
        self.clock = clock
        self._open: dict[GuardedHttpProtocol, None] = {}  # insertion-ordered set

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, connection: GuardedHttpProtocol) -> bool:
        """Count a new connection in, making room if needed; ``False``: no room."""
        if len(self._open) >= self.cap:
            waiting = self._longest_waiting(1)
            if not waiting:
                return False
            waiting[0].evict()
        self._open[connection] = None
        self.metrics.http_connections.set(len(self._open))
        return True

    def release(self, connection: GuardedHttpProtocol) -> None:
        """Count a connection out (once: closing it and losing it both tell)."""
        if connection in self._open:
            del self._open[connection]
            self.metrics.http_connections.set(len(self._open))

    def closed(self, reason: str) -> None:
        self.metrics.http_connections_closed.labels(reason).inc()

    def exhausted(self, exc: OSError) -> None:
        """The listener could not accept for lack of descriptors (or memory): counted,
        logged (at most once a minute), and a tenth of the cap's idle connections closed."""
        self.metrics.accept_exhausted.inc()
        shed = self.shed(max(1, self.cap // 10))
        log.warning(
            "%s (%s): not accepting for a second; %d REST connections open, %d idle ones closed",
            EXHAUSTED_LINE,
            exc.strerror,
            len(self._open),
            shed,
        )

    def shed(self, count: int) -> int:
        """Close up to ``count`` of the connections that have waited longest for a
        request or its headers (to give descriptors back); how many were closed."""
        victims = self._longest_waiting(count)
        for victim in victims:
            victim.evict()
        return len(victims)

    def _longest_waiting(self, count: int) -> list[GuardedHttpProtocol]:
        # a linear scan, only at the cap: a few hundred connections at most
        waiting = [c for c in self._open if c.evictable()]
        waiting.sort(key=lambda c: (c.phase != CLOSING, c.since))  # the closing ones first
        return waiting[:count]


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for each phase of a connection
    and a place among at most ``tracker.cap`` (see the module's docstring).

    ``tracker`` is set on the subclass
    :func:`~cloud_gateway.rest.direct.direct_protocol_class` makes for one server.
    """

    tracker: ConnectionTracker

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.phase = IDLE
        self.since = 0.0
        self._deadline: asyncio.TimerHandle | None = None
        self._header_bytes = 0  # as read, while the head is not all in
        self._parsed_head = 0  # as parsed: the request line and the headers
        self.refused = False  # closed by the guard: the parser's later events are dropped
        self._dropped = 0  # bytes read and dropped while closing

    # -- the phases ---------------------------------------------------------------------

    def _enter(
        self,
        phase: str,
        timeout: float | None = None,
        on_timeout: Callable[[], None] | None = None,
    ) -> None:
        """Enter ``phase``; ``on_timeout`` is called if it lasts ``timeout`` seconds."""
        self.phase = phase
        self.since = self.tracker.clock()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if timeout is not None and on_timeout is not None:
            self._deadline = self.loop.call_later(timeout, on_timeout)

    def _wait_for_request(self) -> None:
        self._header_bytes = 0
        # uvicorn's own keep-alive timer, which it cancels when a byte arrives (and
        # which it never starts for a fresh connection)
        self._unset_keepalive_if_required()
        self._enter(IDLE)
        self.timeout_keep_alive_task = self.loop.call_later(
            self.tracker.settings.keep_alive_timeout_s, self.timeout_keep_alive_handler
        )

    def _start_request(self) -> None:
        self._header_bytes = self._parsed_head = 0
        timeout = self.tracker.settings.header_timeout_s
        self._enter(HEADERS, timeout, self._headers_late)

    def evictable(self) -> bool:
        """Waiting for a request or its headers, with nothing being answered."""
        if self.phase == CLOSING:
            return True
        answered = self.cycle is None or self.cycle.response_complete
        return self.phase in (IDLE, HEADERS) and answered and not self.pipeline

    # -- closing ------------------------------------------------------------------------

    def _may_answer(self) -> bool:
        """Whether no answer is under way, so that one of ours cannot cut into it."""
        if self.cycle is None:
            return True
        if self.phase == BODY:  # the cycle is this request's
            return not self.cycle.response_started
        return self.cycle.response_complete  # the cycle is the previous request's

    def _close(
        self, reason: str, status: int | None, message: str = "", *, linger: bool = True
    ) -> None:
        """Close the connection, answering ``status`` first where that cuts into nothing.

        After an answer the connection lingers (:data:`LINGER_S`, :data:`LINGER_BYTES`):
        its sending side is shut and what the client still sends is read and dropped,
        since closing with bytes unread resets the connection, and a client still
        sending (a head or a body too large) would lose its answer to the reset.
        """
        self.refused = True
        if self.transport.is_closing() or self.phase == CLOSING:
            return
        self.tracker.closed(reason)
        if status is not None and self._may_answer():
            default = self.server_state.default_headers
            self.transport.write(_json_response(status, message, default))
            if linger and self.transport.can_write_eof():
                self.transport.write_eof()
                self._dropped = 0
                self._enter(CLOSING, LINGER_S, self._end)
                return
        self._end()

    def _end(self) -> None:
        self.transport.close()
        self.tracker.release(self)

    def evict(self) -> None:
        """Close to make room for another connection."""
        if self.phase == CLOSING:
            self._end()
            return
        busy = self.phase == HEADERS
        self._close("evicted", 503 if busy else None, "the gateway needed this connection")

    def _headers_late(self) -> None:
        seconds = self.tracker.settings.header_timeout_s
        self._close("header_timeout", 408, f"the request's headers took over {seconds:g} s")

    def _headers_too_large(self) -> None:
        limit = self.tracker.settings.max_header_bytes
        self._close("header_too_large", 431, f"the request's headers exceed {limit} bytes")

    def _body_late(self) -> None:
        seconds = self.tracker.settings.body_timeout_s
        self._close("body_timeout", 408, f"the request's body took over {seconds:g} s")

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            self.tracker.closed("idle")
        super().timeout_keep_alive_handler()

    def send_400_response(self, msg: str) -> None:
        # uvicorn's own answer is plain text: every answer of the gateway is JSON
        self.tracker.closed("malformed")
        self.transport.write(_json_response(400, msg, self.server_state.default_headers))
        self.transport.close()

    # -- asyncio's and the parser's events ----------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # a small answer's head and body in one send (cloud_gateway.rest.coalesce)
        super().connection_made(HeadHeld(transport, self.loop))  # type: ignore[arg-type]
        if not self.tracker.admit(self):
            self.phase = ANSWERING  # never evicted: it is on its way out
            cap = self.tracker.cap
            message = f"the gateway has {cap} connections busy; try again"
            self._close("refused", 503, message, linger=False)  # not counted: not held
            return
        self._wait_for_request()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.tracker.release(self)

    def data_received(self, data: bytes) -> None:
        if self.phase == CLOSING:
            self._dropped += len(data)
            if self._dropped > LINGER_BYTES:
                self._end()
            return
        if self.phase == IDLE:
            # from the first byte, even one the parser skips (a stray CRLF resets
            # uvicorn's keep-alive timer and would hold the connection for ever)
            self._start_request()
        if self.phase == HEADERS:
            self._header_bytes += len(data)
        super().data_received(data)
        if self.phase == HEADERS and self._header_bytes > self.tracker.settings.max_header_bytes:
            self._headers_too_large()

    def on_message_begin(self) -> None:
        if self.refused:
            return
        super().on_message_begin()
        if self.phase != HEADERS:  # a pipelined request behind one being answered
            self._start_request()

    def _head(self, size: int) -> bool:
        """Count ``size`` more bytes of the head as the parser reads it; whether to go
        on. A head that comes whole in one read is counted here, before any of it
        reaches the application (the count by reads only sees heads cut across them)."""
        if self.refused:
            return False
        self._parsed_head += size
        if self._parsed_head > self.tracker.settings.max_header_bytes:
            self._headers_too_large()
            return False
        return True

    def on_url(self, url: bytes) -> None:
        if self._head(len(url)):
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head(len(name) + len(value) + 4):  # with ": " and the line's end
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self.refused:
            return
        super().on_headers_complete()
        self._enter(BODY, self.tracker.settings.body_timeout_s, self._body_late)

    def on_body(self, body: bytes) -> None:
        if not self.refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self.refused:
            return
        super().on_message_complete()
        if self.cycle is not None and self.cycle.response_complete:
            self._wait_for_request()  # answered before its body was in (a 413, a 401)
        else:
            self._enter(ANSWERING)

    def on_response_complete(self) -> None:
        queued = bool(self.pipeline)  # uvicorn starts the next one: it is being answered
        super().on_response_complete()
        if self.transport.is_closing():
            return
        # the deadline of the phase the client is in applies, not uvicorn's keep-alive
        self._unset_keepalive_if_required()
        if self.phase == ANSWERING and not queued:
            self._wait_for_request()


class Listener(socket.socket):
    """A listening socket that, once ``accept()`` has failed for lack of descriptors
    or memory, fails the rest of that burst as "nothing to accept".

    asyncio then stops accepting for a second (its own back-off) once, instead of
    retrying up to the backlog's size in a row with a traceback each time
    (CPython 3.11's ``_accept_connection``). ``on_exhausted`` is told each time.
    """

    on_exhausted: Callable[[OSError], None] | None = None
    _quiet_until = 0.0

    def accept(self) -> tuple[socket.socket, Any]:
        if time.monotonic() < self._quiet_until:
            raise BlockingIOError(errno.EAGAIN, "not accepting for now: out of descriptors")
        try:
            return super().accept()
        except OSError as exc:
            if exc.errno not in _EXHAUSTED:
                raise
            self._quiet_until = time.monotonic() + _ACCEPT_PAUSE_S
            if self.on_exhausted is not None:
                self.on_exhausted(exc)
            raise


def install_exhaustion_handler(
    loop: asyncio.AbstractEventLoop, listener: socket.socket
) -> Callable[[], None]:
    """Keep asyncio's report of ``listener`` running out of descriptors (a traceback
    each time) out of the log: :class:`Listener` has told it already. Returns what
    puts the previous handler back."""
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        sock = context.get("socket")
        ours = sock is not None and sock.fileno() == listener.fileno() != -1
        if context.get("message") == ACCEPT_MESSAGE and ours:
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    return lambda: loop.set_exception_handler(previous)
