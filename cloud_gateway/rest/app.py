"""The REST front end: the Open Inference Protocol's HTTP endpoints on FastAPI.

A thin translation: parse the body (JSON, or JSON plus binary tensors),
authenticate, call the data plane, encode the response. Errors become
``{"error": "<what was wrong>"}`` with the status from the one table in
:mod:`edge_core.status`; nothing else (no traceback) reaches a client. A
client that goes away before its body is in is counted
(``gateway_client_disconnects_total``) and logged at debug level only.

The inference route is the exception to "on FastAPI" where uvicorn serves it:
:class:`~cloud_gateway.rest.infer.InferFront` answers it ahead of the application,
with the same function (:func:`~cloud_gateway.rest.infer.run_infer`).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from cloud_gateway.access import Access
from cloud_gateway.auth import Device, parse_bearer
from cloud_gateway.dashboard.api import add_api_routes
from cloud_gateway.dashboard.context import DashboardContext
from cloud_gateway.dashboard.pages import add_page_routes
from cloud_gateway.dataplane import DataPlane
from cloud_gateway.fleet.ingest import TelemetryIngest
from cloud_gateway.fleet.telemetry import MAX_PAYLOAD_BYTES, body_schema
from cloud_gateway.metrics import CONTENT_TYPE
from cloud_gateway.ota.service import OtaService
from cloud_gateway.rest.body import read_body
from cloud_gateway.rest.infer import error_response, run_infer
from cloud_gateway.rest.ota import add_ota_routes
from edge_core import __version__
from edge_core.errors import EdgeError, PermissionDenied, RequestError, Unavailable
from edge_core.protocol.rest import load_json
from edge_core.status import status_of

__all__ = ["create_app"]

log = logging.getLogger(__name__)

_TENSOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "datatype": {"type": "string"},
        "parameters": {"type": "object"},
        "data": {"type": "array"},
    },
}
_INFER_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["inputs"],
                    "properties": {
                        "id": {"type": "string"},
                        "parameters": {"type": "object"},
                        "inputs": {"type": "array", "items": _TENSOR_SCHEMA},
                        "outputs": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "parameters": {"type": "object"},
                                },
                            },
                        },
                    },
                }
            }
        },
    }
}


_TELEMETRY_BODY: dict[str, Any] = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": body_schema()}}}
}


def create_app(
    plane: DataPlane,
    access: Access,
    ota: OtaService | None = None,
    *,
    telemetry: TelemetryIngest | None = None,
    dashboard: DashboardContext | None = None,
) -> FastAPI:
    """The FastAPI application of one gateway (with the update service, the telemetry
    ingest and the dashboard when given)."""
    app = FastAPI(
        title="edge-inference gateway",
        version=__version__,
        description="The Open Inference Protocol (KServe v2) with the binary tensor extension.",
        docs_url=None,
        redoc_url=None,
    )
    _add_error_handlers(app, plane)
    _add_health_routes(app, plane, access)
    _add_metadata_routes(app, plane, access)
    _add_infer_routes(app, plane, access)
    _add_repository_routes(app, plane, access)
    if ota is not None:
        add_ota_routes(app, ota, functools.partial(_authenticate, access))
    if telemetry is not None:
        _add_telemetry_route(app, telemetry, access)
    if dashboard is not None:
        add_page_routes(app, dashboard)
        add_api_routes(app, dashboard)
    return app


def _authenticate(
    access: Access, request: Request, *, admin: bool = False, scrape: bool = False
) -> Device:
    """The device a request's bearer token names (see :meth:`Access.authenticate`).

    Raises:
        Unauthenticated, PermissionDenied, RateLimited
    """
    token = parse_bearer(request.headers.get("authorization"))
    return access.authenticate(token, admin=admin, scrape=scrape)


def _add_error_handlers(app: FastAPI, plane: DataPlane) -> None:
    """Every error as ``{"error": ...}`` with the status of the one table; nothing else
    (no traceback) reaches a client."""

    async def known_error(request: Request, exc: Exception) -> JSONResponse:
        if status_of(exc).http >= 500:
            log.error("%s %s failed: %s", request.method, request.url.path, exc)
        return error_response(exc)

    app.add_exception_handler(RequestError, known_error)
    app.add_exception_handler(EdgeError, known_error)

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return JSONResponse({"error": "internal error"}, status_code=500)

    @app.exception_handler(ClientDisconnect)
    async def client_disconnect(request: Request, exc: ClientDisconnect) -> Response:
        # A client that goes away mid-body is an ordinary event: counted, one line at
        # debug level (any client can cause it, as often as it likes).
        plane.metrics.client_disconnects.labels("http").inc()
        log.debug("client went away during %s %s", request.method, request.url.path)
        return Response(status_code=499)  # nginx's "client closed request"; never sent

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()
        )
        return JSONResponse({"error": f"invalid request: {details}"}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code)


def _add_health_routes(app: FastAPI, plane: DataPlane, access: Access) -> None:
    """Liveness and readiness (open to all), and the Prometheus metrics."""

    @app.get("/v2/health/live", summary="Server liveness")
    async def live() -> Response:
        if not plane.live():
            raise Unavailable("the gateway is stopping")
        return Response(status_code=200)

    @app.get("/v2/health/ready", summary="Server readiness")
    async def ready() -> Response:
        why = plane.not_ready()
        if why is not None:
            raise Unavailable(f"the gateway is not ready: {why}")
        return Response(status_code=200)

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics(request: Request) -> Response:
        # the series that name devices and groups are the operators' (an admin or a
        # metrics token); with `[metrics] public`, anyone else reads the rest; a token
        # given is checked
        public = plane.config.metrics_public
        operator = False
        if not public or "authorization" in request.headers:
            operator = _authenticate(access, request, scrape=True).role in ("admin", "metrics")
            if not (operator or public):
                raise PermissionDenied(
                    "/metrics names the fleet's devices: it takes a metrics or an admin "
                    "token (or [metrics] public = true for the series that name none)"
                )
        return Response(plane.metrics.render(operator=operator), media_type=CONTENT_TYPE)


def _add_metadata_routes(app: FastAPI, plane: DataPlane, access: Access) -> None:
    """The server's and the models' metadata and readiness, for any device."""

    @app.get("/v2", summary="Server metadata")
    async def server_metadata(request: Request) -> JSONResponse:
        _authenticate(access, request)
        return JSONResponse(plane.server_metadata())

    @app.get("/v2/models/{name}", summary="Model metadata")
    @app.get("/v2/models/{name}/versions/{version}", summary="Model metadata of a version")
    async def model_metadata(request: Request, name: str, version: str = "") -> JSONResponse:
        _authenticate(access, request)
        return JSONResponse(plane.model_metadata(name, version))

    @app.get("/v2/models/{name}/ready", summary="Model readiness")
    @app.get("/v2/models/{name}/versions/{version}/ready", summary="Model version readiness")
    async def model_ready(request: Request, name: str, version: str = "") -> Response:
        _authenticate(access, request)
        if not plane.model_ready(name, version):
            raise Unavailable(f"model {name!r} is not ready")
        return Response(status_code=200)


def _add_infer_routes(app: FastAPI, plane: DataPlane, access: Access) -> None:
    """Inference, as the OpenAPI document describes it and a bare ASGI server runs it."""
    max_body = plane.config.max_body_bytes

    @app.post("/v2/models/{name}/infer", summary="Inference", openapi_extra=_INFER_BODY)
    @app.post(
        "/v2/models/{name}/versions/{version}/infer",
        summary="Inference on a version",
        openapi_extra=_INFER_BODY,
    )
    async def infer(request: Request, name: str, version: str = "") -> Response:
        # uvicorn's requests for these paths are answered by InferFront, ahead of FastAPI
        return await run_infer(
            plane, access, request.headers, lambda: read_body(request, max_body), name, version
        )


def _add_repository_routes(app: FastAPI, plane: DataPlane, access: Access) -> None:
    """The model repository's index (any device: what the cloud can answer; an admin
    also sees why a version is unavailable), load and unload (admin tokens only)."""

    @app.post("/v2/repository/index", summary="Repository index")
    async def repository_index(request: Request) -> JSONResponse:
        device = _authenticate(access, request)
        return JSONResponse(plane.repository_index(admin=device.role == "admin"))

    @app.post("/v2/repository/models/{name}/load", summary="Load a model")
    async def repository_load(request: Request, name: str) -> Response:
        _authenticate(access, request, admin=True)
        await plane.load(name)
        return Response(status_code=200)

    @app.post("/v2/repository/models/{name}/unload", summary="Unload a model")
    async def repository_unload(request: Request, name: str) -> Response:
        _authenticate(access, request, admin=True)
        await plane.unload(name)
        return Response(status_code=200)


def _add_telemetry_route(app: FastAPI, telemetry: TelemetryIngest, access: Access) -> None:
    """A device's telemetry over HTTP, for a device with no broker."""

    @app.post(
        "/v2/telemetry",
        summary="A device's telemetry, sent with its update checks when it has no broker",
        openapi_extra=_TELEMETRY_BODY,
    )
    async def take_telemetry(request: Request) -> JSONResponse:
        device = _authenticate(access, request)
        body = load_json(await read_body(request, MAX_PAYLOAD_BYTES), "the telemetry")
        return JSONResponse({"kept": telemetry.offer_http(device.id, body)})
