"""Inference requests answered on the connection itself, without an ASGI cycle.

Through uvicorn, each request becomes a request-response cycle: a scope, an ASGI
task, ``receive`` and ``send`` messages, a Starlette response sent in two parts. For
the request a fleet sends all day that machinery costs measurably
(docs/benchmarks/index.md, "Beside Triton and MLServer", has the figures before
and after).

So :class:`DirectInferProtocol` (uvicorn's httptools protocol, with the guard of
:class:`~cloud_gateway.rest.connections.GuardedHttpProtocol`) takes a
``POST /v2/models/{name}[/versions/{version}]/infer`` as its parser reads it: the
device is authenticated once the headers are in (a refusal, or a ``Content-Length``
over the limit, is answered at once and the body read and dropped, as the ASGI path
does), the body is gathered, and one task runs
:func:`~cloud_gateway.rest.infer.answer_infer` (the function the ASGI path runs, so
the answers and errors are the same) and writes its response in one send.

Every other request, and any one this path does not take on (a request that
``Expect``\\s ``100-continue``, an upgrade, one pipelined behind another), goes
through uvicorn as before: to :class:`~cloud_gateway.rest.infer.InferFront`, then
the application. While a direct answer is under way, the connection's ``cycle`` is
a :class:`_Direct`, which uvicorn and the guard read like a cycle: a request
pipelined behind it waits in uvicorn's queue until it is answered.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import httptools
from starlette.responses import Response
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from cloud_gateway.access import Access
from cloud_gateway.auth import Device
from cloud_gateway.dataplane import DataPlane
from cloud_gateway.rest.body import check_declared, check_received
from cloud_gateway.rest.connections import (
    ANSWERING,
    BODY,
    ConnectionTracker,
    GuardedHttpProtocol,
)
from cloud_gateway.rest.infer import (
    answer_infer,
    authenticate_infer,
    error_response,
    infer_route,
    internal_error,
    request_headers,
    respond,
)
from edge_core.errors import EdgeError, PayloadTooLarge, RequestError

__all__ = ["DirectInferProtocol", "direct_protocol_class"]


class _Event:
    """What uvicorn's ``connection_lost`` sets on a cycle: nobody waits on it here."""

    def set(self) -> None:
        pass


class _Direct:
    """One request taken by :class:`DirectInferProtocol`: in the connection's ``cycle``
    while it is answered, with the attributes uvicorn and the guard read there.

    uvicorn's own ``on_body`` and ``on_message_complete``, which write a cycle's
    ``body`` and ``more_body``, never see one: the protocol handles those events while
    the request is in, and the next request's headers replace the ``cycle``."""

    message_event = _Event()
    more_body = False

    def __init__(
        self, path: str, route: tuple[str, str], headers: dict[str, str], keep_alive: bool
    ) -> None:
        self.path = path
        self.route = route
        self.headers = headers
        self.keep_alive = keep_alive
        self.device: Device | None = None
        self.parts: list[bytes] = []  # the body as it came
        self.size = 0
        self.response_started = False
        self.response_complete = False
        self.disconnected = False


class DirectInferProtocol(GuardedHttpProtocol):
    """The guarded httptools protocol, answering inference requests itself (see the
    module's docstring). ``plane`` and ``access`` are set on the subclass
    :func:`direct_protocol_class` makes for one server."""

    plane: DataPlane
    access: Access
    _direct: _Direct | None = None

    # -- the parser's events --------------------------------------------------------------

    def on_headers_complete(self) -> None:
        if self.refused:  # closed by the guard while parsing (a head too large)
            return
        direct = self._take()
        if direct is None:
            super().on_headers_complete()
            return
        self._direct = direct
        self.cycle = direct  # type: ignore[assignment]  # read as a cycle (module docstring)
        self._enter(BODY, self.tracker.settings.body_timeout_s, self._body_late)
        try:
            direct.device = authenticate_infer(
                self.plane, self.access, direct.headers, direct.route[0]
            )
        except (RequestError, EdgeError) as exc:
            self._write(direct, error_response(exc))
            return
        except Exception:  # the gateway's fault (its state database, say), not the client's
            self._internal(direct)
            return
        try:
            check_declared(direct.headers.get("content-length"), self.plane.config.max_body_bytes)
        except (RequestError, EdgeError) as exc:
            self._refuse(direct, exc)

    def on_body(self, body: bytes) -> None:
        direct = self._direct
        if direct is None or self.refused:
            super().on_body(body)
            return
        if direct.response_complete:
            return  # answered before its body was in: read, and dropped
        direct.size += len(body)
        try:
            check_received(direct.size, self.plane.config.max_body_bytes)
        except PayloadTooLarge as exc:
            self._refuse(direct, exc)
            return
        direct.parts.append(body)

    def on_message_complete(self) -> None:
        direct = self._direct
        if direct is None or self.refused:
            super().on_message_complete()
            return
        self._direct = None
        if direct.response_complete:
            self._wait_for_request()  # answered before its body was in (a 413, a 401)
            return
        self._enter(ANSWERING)
        task = self.loop.create_task(self._answer(direct))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)  # uvicorn's graceful shutdown waits for it

    # -- the answer -----------------------------------------------------------------------

    def _refuse(self, direct: _Direct, exc: RequestError | EdgeError) -> None:
        """Answer ``exc`` before the body is all in (counted, as the ASGI path does)."""
        self.plane.count_failure(direct.route[0], "http", exc)
        self._write(direct, error_response(exc))

    def _internal(self, direct: _Direct) -> None:
        """Answer 500 for an unexpected error (logged with its traceback) and close, as
        uvicorn does for an application that fails."""
        direct.keep_alive = False
        self._write(direct, internal_error(direct.path))

    def _take(self) -> _Direct | None:
        """The request whose headers are in, if this path takes it on."""
        parser = self.parser
        if parser.get_method() != b"POST" or self.expect_100_continue or parser.should_upgrade():
            return None
        if not (self.cycle is None or self.cycle.response_complete) or self.pipeline:
            return None  # behind another request: uvicorn's queue keeps the order
        if self.flow.write_paused:
            return None  # answers not read: uvicorn's cycle waits for them to drain
        path = httptools.parse_url(self.url).path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)  # as uvicorn gives the path to ASGI
        route = infer_route(path)
        if route is None:
            return None
        headers = request_headers(self.headers)
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        return _Direct(path, route, headers, keep_alive)

    async def _answer(self, direct: _Direct) -> None:
        name, version = direct.route
        content = direct.parts[0] if len(direct.parts) == 1 else b"".join(direct.parts)
        device = direct.device
        assert device is not None

        def call() -> Any:
            return answer_infer(self.plane, device, direct.headers, content, name, version)

        try:
            response = await respond(direct.path, call)
        except BaseException:  # cancelled (a shutdown past its grace), or worse
            if not direct.response_started:
                self._internal(direct)
            self.transport.close()
            raise
        self._write(direct, response)

    def _write(self, direct: _Direct, response: Response) -> None:
        """Send ``response`` in one write, then go on as uvicorn does after an answer."""
        direct.response_started = True
        if not direct.disconnected and not self.transport.is_closing():
            head = [STATUS_LINE[response.status_code]]
            for name, value in (*self.server_state.default_headers, *response.raw_headers):
                head += (name, b": ", value, b"\r\n")
            if not direct.keep_alive:
                head.append(b"connection: close\r\n")
            head.append(b"\r\n")
            self.transport.write(b"".join(head) + response.body)
        direct.response_complete = True
        if not direct.keep_alive:
            self.transport.close()
        self.on_response_complete()

    def shutdown(self) -> None:
        direct = self._direct
        if direct is not None and not direct.response_complete:
            # its body still coming: no task yet for the server's shutdown to wait for
            self._close("stopping", 503, "the gateway is stopping")
            return
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        direct = self._direct
        if direct is not None and not direct.response_complete:
            # gone during its body: what the ASGI path counts as a disconnect
            self.plane.metrics.client_disconnects.labels("http").inc()
        super().connection_lost(exc)


def direct_protocol_class(
    tracker: ConnectionTracker, plane: DataPlane, access: Access
) -> type[DirectInferProtocol]:
    """The protocol class to give uvicorn (``http=``) for one server: connections
    counted by ``tracker``, callers authenticated by ``access``, inference requests
    answered by ``plane``."""

    class Protocol(DirectInferProtocol):
        pass

    Protocol.tracker = tracker
    Protocol.plane = plane
    Protocol.access = access
    return Protocol
