"""The local API over HTTP: the Open Inference Protocol's REST endpoints, on
``127.0.0.1`` or a Unix socket, so an application calls the agent as it would
call Triton (``tritonclient.http`` works unchanged).

The standard library's threading HTTP server: a device's local API serves
one or a few applications, and a web framework would cost the agent's idle
memory more than it buys (FastAPI and uvicorn: ~15 MB here). HTTP/1.1 with
keep-alive. Every answer is JSON (``{"error": ...}`` for errors, the
server's own 400/414/431/501/505 included), never an HTML page or a
traceback. Bounded, per ``[api]``:

- at most ``max_connections`` connections at once, each on its own thread;
  one more is answered 503 at once and closed;
- an idle keep-alive connection is closed after ``idle_timeout_s``; once a
  request's first byte has come, its headers and body must be in within
  ``request_timeout_s`` (a client that trickles a byte at a time is cut off:
  408, and the connection closed);
- bodies up to ``max_body_bytes``, with a ``Content-Length`` or chunked.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import socket
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from edge_agent.config import ApiSettings
from edge_agent.service.frontend import LocalService
from edge_agent.service.metrics import CONTENT_TYPE
from edge_core import __version__
from edge_core.errors import InputError, PayloadTooLarge, ProtocolError
from edge_core.fields import is_decimal
from edge_core.protocol.rest import HEADER_LENGTH, decode_infer_request, encode_infer_response
from edge_core.status import status_of

__all__ = ["HttpApi"]

log = logging.getLogger(__name__)

SERVER = {"name": "edge-agent", "version": __version__, "extensions": ["binary_tensor_data"]}
_MODEL = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?(/ready|/infer|/explain)?$")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_EVENTS = re.compile(r"^/v2/streams/([A-Za-z0-9][A-Za-z0-9._-]{0,63})/events$")
HEARTBEAT_S = 15.0  # a comment line this often keeps an idle event stream open


class _Deadlines(io.RawIOBase):
    """The connection's socket as a raw stream whose reads wait at most until a
    deadline: ``idle_s`` for a request's first byte, then ``request_s`` from it
    for the rest of its headers and body (``restart`` before each request)."""

    def __init__(self, sock: socket.socket, idle_s: float, request_s: float) -> None:
        self._sock = sock
        self._idle_s = idle_s
        self._request_s = request_s
        self._deadline: float | None = None
        self.cut_short = False  # a request's time ran out while it was arriving

    def readable(self) -> bool:
        return True

    def restart(self) -> None:
        self._deadline = None
        self.cut_short = False

    def readinto(self, buffer: Any) -> int:
        if self._deadline is None:
            self._sock.settimeout(self._idle_s)
        else:
            left = self._deadline - time.monotonic()
            if left <= 0:
                self.cut_short = True
                raise TimeoutError("the request took too long to arrive")
            self._sock.settimeout(left)
        try:
            count = self._sock.recv_into(buffer)
        except TimeoutError:
            self.cut_short = self._deadline is not None
            raise
        if count and self._deadline is None:
            self._deadline = time.monotonic() + self._request_s
        return count


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "edge-agent"
    service: LocalService
    settings: ApiSettings

    def setup(self) -> None:
        super().setup()
        if self.connection.family in (socket.AF_INET, socket.AF_INET6):
            # answers are small: send them now, not after the client's delayed ACK
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._reads = _Deadlines(
            self.connection, self.settings.idle_timeout_s, self.settings.request_timeout_s
        )
        self.rfile = io.BufferedReader(self._reads)

    def handle_one_request(self) -> None:
        self._reads.restart()
        try:
            super().handle_one_request()  # a read that times out closes the connection
        except TimeoutError:  # in a body read: the base class catches those of the headers
            self.close_connection = True
        if self._reads.cut_short:  # not idle: a request that trickled in is told why
            self._reads.restart()
            with contextlib.suppress(OSError):
                self._error(408, f"the request took over {self.settings.request_timeout_s} s")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # requests are counted in /metrics; errors are logged where they happen

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The server's own errors (a malformed request line, headers too long, an
        unsupported method or version) as JSON, as every other answer."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # the request line did not parse: no version
            self.request_version = self.protocol_version
        with contextlib.suppress(OSError):  # the client went away
            self._error(code, message or self.responses.get(code, ("error",))[0])

    def _send(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, document: Any) -> None:
        self._send(status, json.dumps(document).encode(), "application/json")

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})

    def _body(self) -> bytes | None:
        """The request's body (``None``: refused, and answered already)."""
        limit = self.settings.max_body_bytes
        try:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                return self._chunked(limit)
            length = self.headers.get("Content-Length", "0")
            if not is_decimal(length) or len(length) > 19:
                raise ProtocolError("Content-Length must be a decimal number of bytes")
            if int(length) > limit:
                raise PayloadTooLarge(f"the body is {length} bytes; the limit is {limit}")
            body = self.rfile.read(int(length))
            if len(body) < int(length):
                raise ProtocolError("the body ended before its Content-Length")
            return body
        except (ProtocolError, PayloadTooLarge) as exc:
            self.close_connection = True  # what is left of the body would be read as a request
            self._error(status_of(exc).http, str(exc))
            return None

    def _chunked(self, limit: int) -> bytes:
        """A chunked body, at most ``limit`` bytes.

        Raises:
            ProtocolError: the chunks are malformed; PayloadTooLarge: over ``limit``.
        """
        parts: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(64).split(b";", 1)[0].strip()
            if _CHUNK_SIZE.fullmatch(line) is None:
                raise ProtocolError("malformed chunked body: a chunk size in hex was expected")
            size = int(line, 16)
            if size == 0:
                break
            total += size
            if total > limit:
                raise PayloadTooLarge(f"the chunked body is over the limit of {limit} bytes")
            chunk = self.rfile.read(size)
            if len(chunk) < size or self.rfile.read(2) != b"\r\n":
                raise ProtocolError("malformed chunked body: a chunk is cut short")
            parts.append(chunk)
        for _ in range(64):  # trailers, up to the blank line
            if self.rfile.readline(8192).strip() == b"":
                return b"".join(parts)
        raise ProtocolError("malformed chunked body: too many trailer lines")

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        service = self.service
        if path == "/v2/health/live":
            return self._json(200, {"live": True})
        if path == "/v2/health/ready":
            return self._json(200 if service.ready else 503, {"ready": service.ready})
        if path == "/v2":
            return self._json(200, SERVER)
        if path == "/metrics":
            return self._send(200, service.metrics.render(), CONTENT_TYPE)
        if path == "/v2/models":
            return self._json(200, {"models": [m["name"] for m in service.repository_index()]})
        events = _EVENTS.match(path)
        if events is not None:
            return self._events(events.group(1))
        match = _MODEL.match(path)
        if match is None or match.group(3) in ("/infer", "/explain"):
            return self._error(404, f"no such endpoint: GET {path}")
        name, version, ready = match.groups()
        try:
            metadata = service.model_metadata(name, version or "")
        except Exception as exc:
            status = status_of(exc)
            return self._error(status.http, status.message)
        if ready:
            return self._json(200 if service.ready else 503, {"name": name, "ready": True})
        return self._json(200, metadata)

    def _events(self, name: str) -> None:
        """A stream's results as server-sent events (``data: {...}``), for a local app, until
        it goes away; a slow reader loses old results (its own bounded queue), never holds
        up the stream, and a reader that stops reading is cut after ``request_timeout_s``."""
        streams = self.service.streams
        broadcaster = streams.events(name) if streams is not None else None
        if broadcaster is None:
            return self._error(404, f'no stream {name!r} with sink = "sse" on this device')
        subscriber = broadcaster.subscribe()
        if subscriber is None:
            return self._error(503, f"stream {name!r} has as many listeners as it takes")
        self.close_connection = True  # the answer ends when the connection does
        try:
            self.connection.settimeout(self.settings.request_timeout_s)  # for the writes
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            while self.service.ready and not subscriber.ended:
                line = subscriber.next(HEARTBEAT_S)
                if line is None and subscriber.ended:
                    break  # the stream was stopped or replaced: the listener connects again
                self.wfile.write(
                    b": keep-alive\n\n" if line is None else f"data: {line}\n\n".encode()
                )
                self.wfile.flush()
        except OSError:
            pass  # the reader went away, or stopped reading
        finally:
            subscriber.close()

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/v2/repository/index":  # the repository extension's listing (read only)
            if self._body() is not None:
                self._json(200, self.service.repository_index())
            return None
        match = _MODEL.match(path)
        if match is None or match.group(3) not in ("/infer", "/explain"):
            if self._body() is not None:  # else it has answered already (411, 413)
                self._error(404, f"no such endpoint: POST {path}")
            return None
        body = self._body()
        if body is None:
            return None
        rid = self.headers.get("X-Request-Id") or None
        label = self.headers.get("X-Edge-Label")
        try:
            header = self.headers.get(HEADER_LENGTH)
            if header is not None and (not is_decimal(header) or len(header) > 19):
                raise InputError(f"{HEADER_LENGTH} must be a non-negative integer")
            request = decode_infer_request(body, int(header) if header is not None else None)
            request.model_name, request.model_version = match.group(1), match.group(2) or ""
            if match.group(3) == "/explain":
                return self._json(200, self.service.explain(request, label=label))
            response = self.service.infer(request, label=label, request_id=rid)
            out, header_length = encode_infer_response(response, request)
        except Exception as exc:
            status = status_of(exc)
            message = status.message
            document: dict[str, Any] = {"error": message}
            decision = getattr(exc, "decision", None)
            if decision is not None:
                document["decision"] = decision.to_dict()
            return self._json(status.http, document)
        headers = {"X-Request-Id": str(response.parameters["request_id"])}
        if header_length is not None:
            headers[HEADER_LENGTH] = str(header_length)
            return self._send(200, out, "application/octet-stream", headers)
        return self._send(200, out, "application/json", headers)


_BUSY_BODY = b'{"error": "too many connections to the local API; retry later"}'
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


class _Bounded(socketserver.ThreadingMixIn, socketserver.BaseServer):
    """A thread per connection, at most ``max_connections`` of them: one more is
    answered 503 on the accepting thread and closed."""

    daemon_threads = True
    request_queue_size = 128  # the listen backlog: a burst of applications connecting at once
    slots: threading.BoundedSemaphore

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            try:
                request.settimeout(0.5)
                request.sendall(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _TcpServer(_Bounded, ThreadingHTTPServer):
    pass


class _Tcp6Server(_TcpServer):
    address_family = socket.AF_INET6


class _UnixServer(_Bounded, socketserver.UnixStreamServer):
    def get_request(self) -> tuple[Any, Any]:
        connection, _ = super().get_request()
        return connection, ("unix", 0)  # the handler expects a (host, port) address


class HttpApi:
    """The HTTP server in a background thread."""

    def __init__(self, service: LocalService, settings: ApiSettings | None = None) -> None:
        """``settings``: the address (``host`` and ``http_port``, or ``socket``) and
        the limits (see the module's docstring)."""
        settings = settings or ApiSettings()
        handler = type("Handler", (_Handler,), {"service": service, "settings": settings})
        unix_socket = self.unix_socket = settings.socket
        self._server: socketserver.BaseServer
        if unix_socket is not None:
            unix_socket.parent.mkdir(parents=True, exist_ok=True)
            unix_socket.unlink(missing_ok=True)
            self._server = _UnixServer(str(unix_socket), handler)
            os.chmod(unix_socket, 0o660)  # the service's group may call it
            self.address = str(unix_socket)
        else:
            host = settings.host
            server = (_Tcp6Server if ":" in host else _TcpServer)(
                (host, settings.http_port), handler
            )
            self._server = server
            self.port = server.server_address[1]
            self.address = f"{host}:{self.port}"
        self._server.slots = threading.BoundedSemaphore(settings.max_connections)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="local-http", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        log.info("local API (HTTP) on %s", self.address)

    def stop(self, grace: float = 0.0) -> None:
        """Stop accepting connections; requests being answered finish on their threads
        (the daemon waits for them itself, so ``grace`` is not needed here)."""
        self._server.shutdown()
        self._server.server_close()
        if self.unix_socket is not None:
            self.unix_socket.unlink(missing_ok=True)
