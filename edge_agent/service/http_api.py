"""The local API over HTTP: the Open Inference Protocol's REST endpoints, on
``127.0.0.1`` or a Unix socket, so an application calls the agent as it would
call Triton (``tritonclient.http`` works unchanged).

The standard library's threading HTTP server: a device's local API serves
one or a few applications, and a web framework would cost the agent's idle
memory more than it buys (FastAPI and uvicorn: ~15 MB here). HTTP/1.1 with
keep-alive; bodies are bounded; every error is ``{"error": ...}`` with a 4xx
(or 503 while stopping), never a traceback.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from edge_agent.service.frontend import LocalService
from edge_agent.service.metrics import CONTENT_TYPE
from edge_core.errors import InputError, ModelNotFoundError
from edge_core.fields import is_decimal
from edge_core.protocol.rest import HEADER_LENGTH, decode_infer_request, encode_infer_response
from edge_core.status import status_of

__all__ = ["HttpApi"]

log = logging.getLogger(__name__)

SERVER = {"name": "edge-agent", "version": "0.1.0", "extensions": ["binary_tensor_data"]}
_MODEL = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?(/ready|/infer)?$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "edge-agent"
    service: LocalService
    max_body: int

    def setup(self) -> None:
        super().setup()
        if self.connection.family in (socket.AF_INET, socket.AF_INET6):
            # answers are small: send them now, not after the client's delayed ACK
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # requests are counted in /metrics; errors are logged where they happen

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
        length = self.headers.get("Content-Length")
        if length is None or not is_decimal(length):
            self.close_connection = True  # a body of unknown length would be read as a request
            self._error(411, "a Content-Length header (a decimal number) is required")
            return None
        if int(length) > self.max_body:
            self.close_connection = True  # the body is left unread
            self._error(413, f"the body is {length} bytes; the limit is {self.max_body}")
            return None
        return self.rfile.read(int(length))

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
        match = _MODEL.match(path)
        if match is None or match.group(3) == "/infer":
            return self._error(404, f"no such endpoint: GET {path}")
        name, _, ready = match.groups()
        try:
            metadata = service.model_metadata(name)
        except ModelNotFoundError as exc:
            return self._error(404, str(exc))
        if ready:
            return self._json(200 if service.ready else 503, {"name": name, "ready": True})
        return self._json(200, metadata)

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        match = _MODEL.match(path)
        if match is None or match.group(3) != "/infer":
            if self._body() is not None:  # else it has answered already (411, 413)
                self._error(404, f"no such endpoint: POST {path}")
            return None
        body = self._body()
        if body is None:
            return None
        rid = self.headers.get("X-Request-Id") or None
        try:
            header = self.headers.get(HEADER_LENGTH)
            if header is not None and not is_decimal(header):
                raise InputError(f"{HEADER_LENGTH} must be a non-negative integer")
            request = decode_infer_request(body, int(header) if header is not None else None)
            request.model_name, request.model_version = match.group(1), match.group(2) or ""
            response = self.service.infer(
                request, label=self.headers.get("X-Edge-Label"), request_id=rid
            )
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


class _TcpServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the listen backlog: a burst of applications connecting at once


class _Tcp6Server(_TcpServer):
    address_family = socket.AF_INET6


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = 128

    def get_request(self) -> tuple[Any, Any]:
        connection, _ = super().get_request()
        return connection, ("unix", 0)  # the handler expects a (host, port) address


class HttpApi:
    """The HTTP server in a background thread."""

    def __init__(
        self,
        service: LocalService,
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        unix_socket: Path | None = None,
        max_body_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        handler = type("Handler", (_Handler,), {"service": service, "max_body": max_body_bytes})
        self.unix_socket = unix_socket
        self._server: socketserver.BaseServer
        if unix_socket is not None:
            unix_socket.parent.mkdir(parents=True, exist_ok=True)
            unix_socket.unlink(missing_ok=True)
            self._server = _UnixServer(str(unix_socket), handler)
            os.chmod(unix_socket, 0o660)  # the service's group may call it
            self.address = str(unix_socket)
        else:
            server = (_Tcp6Server if ":" in host else _TcpServer)((host, port), handler)
            self._server = server
            self.port = server.server_address[1]
            self.address = f"{host}:{self.port}"
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
