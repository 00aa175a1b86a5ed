"""The REST inference endpoint, and the bare ASGI path that answers it ahead of FastAPI.

``POST /v2/models/{name}[/versions/{version}]/infer`` is the request a fleet sends all
day; every other route is rare. Through FastAPI, that one request paid for its
middleware stack, the match against every route of the application (the update
service's and the dashboard's too) and the solving of two path parameters as
dependencies: under cProfile, as much of the gateway's time as authenticating,
decoding, forwarding to an engine and encoding together (docs/benchmarks/index.md,
"Beside Triton and MLServer", has the throughput before and after).

So :class:`InferFront` sits in front of the application that uvicorn serves: it answers
that route itself, with :func:`run_infer` (the same function the FastAPI route calls,
so both give the same answers and errors) and Starlette's responses, and hands
everything else, unchanged, to the application. The FastAPI route stays: it is what
the OpenAPI document describes, and what an ASGI server given the bare application
runs. Most inference requests do not even reach :class:`InferFront`: the gateway's
connections answer them as they are read (:mod:`cloud_gateway.rest.direct`), with
:func:`authenticate_infer` and :func:`answer_infer`, the two halves of
:func:`run_infer`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping

from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from cloud_gateway.access import Access
from cloud_gateway.auth import Device, parse_bearer
from cloud_gateway.dataplane import DataPlane
from cloud_gateway.rest.body import receive_body
from edge_core.errors import EdgeError, RequestError
from edge_core.protocol.rest import HEADER_LENGTH, decode_infer_request, encode_infer_response
from edge_core.protocol.types import parse_length
from edge_core.status import status_of

__all__ = [
    "InferFront",
    "answer_infer",
    "authenticate_infer",
    "error_response",
    "infer_route",
    "internal_error",
    "request_headers",
    "respond",
    "run_infer",
]

log = logging.getLogger(__name__)

# Starlette's {name} matches one path segment of the decoded path; so does this
_INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
_LENGTH_KEY = HEADER_LENGTH.lower()


def error_response(exc: BaseException) -> JSONResponse:
    """``{"error": ...}`` with the status of ``exc`` from the one table."""
    status = status_of(exc)
    headers = {"WWW-Authenticate": "Bearer"} if status.http == 401 else None
    return JSONResponse({"error": status.message}, status_code=status.http, headers=headers)


def authenticate_infer(
    plane: DataPlane, access: Access, headers: Mapping[str, str], name: str
) -> Device:
    """The device an inference request is from, within its rate limit; a refusal is
    counted. ``headers`` is looked up with lower-case names.

    Raises:
        RequestError or EdgeError: mapped to a status by the caller.
    """
    try:
        return access.authenticate(parse_bearer(headers.get("authorization")))
    except (RequestError, EdgeError) as exc:
        plane.count_failure(name, "http", exc)
        raise


async def answer_infer(
    plane: DataPlane,
    device: Device,
    headers: Mapping[str, str],
    content: bytes,
    name: str,
    version: str,
) -> Response:
    """Decode ``content``, run it on the data plane, encode the answer as the request
    asked.

    Raises:
        RequestError or EdgeError: mapped to a status by the caller.
    """
    try:
        header = headers.get(_LENGTH_KEY)
        length = None if header is None else parse_length(header, HEADER_LENGTH)
        # kept as it came: a model on an HTTP engine gets the device's tensor bytes as they are
        infer_request = decode_infer_request(content, length, keep_raw=True)
    except (RequestError, EdgeError) as exc:
        plane.count_failure(name, "http", exc)
        raise
    infer_request.model_name = name
    infer_request.model_version = version
    request_id = headers.get("x-request-id")
    response = await plane.infer(
        infer_request, device=device, protocol="http", request_id=request_id
    )
    answer, header_length = encode_infer_response(response, infer_request)
    extra = {"X-Request-Id": request_id} if request_id else {}
    if header_length is None:
        return Response(answer, media_type="application/json", headers=extra)
    extra[HEADER_LENGTH] = str(header_length)
    return Response(answer, media_type="application/octet-stream", headers=extra)


async def run_infer(
    plane: DataPlane,
    access: Access,
    headers: Mapping[str, str],
    body: Callable[[], Awaitable[bytes]],
    name: str,
    version: str,
) -> Response:
    """One inference request: authenticate (before the body is read), read and decode
    the body, run it on the data plane, encode the answer as the request asked.

    ``headers`` is looked up with lower-case names.

    Raises:
        RequestError or EdgeError: mapped to a status by the caller.
        starlette.requests.ClientDisconnect: the client went away during its body.
    """
    device = authenticate_infer(plane, access, headers, name)
    try:
        content = await body()
    except (RequestError, EdgeError) as exc:
        plane.count_failure(name, "http", exc)
        raise
    return await answer_infer(plane, device, headers, content, name, version)


def internal_error(path: str) -> JSONResponse:
    """The 500 for an unexpected error on ``path``, logged with its traceback (call it
    while the exception is being handled)."""
    log.exception("unexpected error on POST %s", path)
    return JSONResponse({"error": "internal error"}, status_code=500)


def request_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """A request's headers by their lower-case names, the first of a repeated one (as
    Starlette's ``Headers.get`` gives it)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in reversed(list(raw))}


async def respond(path: str, call: Callable[[], Awaitable[Response]]) -> Response:
    """``call``'s response, or the error response for what it raised (logged when it is
    the gateway's fault).

    Raises:
        starlette.requests.ClientDisconnect: from ``call``.
    """
    try:
        return await call()
    except ClientDisconnect:
        raise
    except (RequestError, EdgeError) as exc:
        if status_of(exc).http >= 500:
            log.error("POST %s failed: %s", path, exc)
        return error_response(exc)
    except Exception:
        return internal_error(path)


def infer_route(path: str) -> tuple[str, str] | None:
    """The model name and version (``""``: the default) of an inference route's path,
    as Starlette's router matches it; ``None`` for any other path."""
    match = _INFER_PATH.fullmatch(path)
    return None if match is None else (match.group(1), match.group(2) or "")


class InferFront:
    """An ASGI application: the inference route answered here, the rest by ``app``."""

    def __init__(self, app: ASGIApp, plane: DataPlane, access: Access) -> None:
        self.app = app
        self.plane = plane
        self.access = access
        self.limit = plane.config.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = None
        if scope["type"] == "http" and scope["method"] == "POST":
            route = infer_route(scope["path"])
        if route is None:
            await self.app(scope, receive, send)
            return
        headers = request_headers(scope["headers"])
        name, version = route

        def body() -> Awaitable[bytes]:
            return receive_body(receive, headers.get("content-length"), self.limit)

        try:
            response = await respond(
                scope["path"],
                lambda: run_infer(self.plane, self.access, headers, body, name, version),
            )
        except ClientDisconnect:
            self.plane.metrics.client_disconnects.labels("http").inc()
            log.debug("client went away during POST %s", scope["path"])
            return
        await response(scope, receive, send)
