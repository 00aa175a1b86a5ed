"""The REST routes of the update service (``/v2/ota/...``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse

from cloud_gateway.auth import Device
from cloud_gateway.ota.service import MAX_FAILURES, REPORT_STATUSES, OtaService
from cloud_gateway.rest.body import read_body
from edge_core.names import MAX_VERSION, MODEL_NAME_PATTERN
from edge_core.protocol.rest import load_json

__all__ = ["add_ota_routes"]

MAX_REPORT_BYTES = 16 * 1024
# the bodies' fields as the OpenAPI document gives them (the service checks each)
_REPORT_BODY: dict[str, Any] = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object",
        "required": ["name", "version", "status"],
        "properties": {
            "name": {"type": "string", "pattern": MODEL_NAME_PATTERN},
            "version": {"type": "integer", "minimum": 1, "maximum": MAX_VERSION},
            "status": {"enum": list(REPORT_STATUSES)},
            "detail": {"type": "string"},
            "serving": {"type": "integer", "minimum": 1, "maximum": MAX_VERSION},
            "smoke": {"type": "object", "properties": {
                "variant": {"type": "string"}, "latency_ms": {"type": "number"}}},
        },
    }}}}
}  # fmt: skip
_CHECK_BODY: dict[str, Any] = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object",
        "required": ["failing"],
        "properties": {
            "failing": {"type": "boolean"},
            "failures": {"type": "integer", "minimum": 1, "maximum": MAX_FAILURES},
            "detail": {"type": "string"},
        },
    }}}}
}  # fmt: skip


class BlobResponse(FileResponse):
    """A file in 1 MiB pieces (Starlette's default, 64 KiB, costs a third of the throughput)."""

    chunk_size = 1 << 20


def add_ota_routes(
    app: FastAPI, ota: OtaService, authenticate: Callable[[Request], Device]
) -> None:
    @app.get("/v2/ota/metadata/{filename}", summary="Signed update metadata")
    async def metadata(request: Request, filename: str) -> FileResponse:
        authenticate(request)
        return FileResponse(ota.metadata_path(filename), media_type="application/json")

    @app.get("/v2/ota/targets/{target:path}", summary="An update target (Range requests allowed)")
    async def target(request: Request, target: str) -> FileResponse:
        device = authenticate(request)
        return BlobResponse(ota.target_path(target, device), media_type="application/octet-stream")

    @app.get("/v2/ota/plan", summary="The model versions this device should run")
    async def plan(request: Request) -> JSONResponse:
        return JSONResponse(ota.plan(authenticate(request)))

    @app.post(
        "/v2/ota/report",
        summary="Report an installation or a failure",
        openapi_extra=_REPORT_BODY,
    )
    async def report(request: Request) -> JSONResponse:
        device = authenticate(request)
        body = await read_body(request, MAX_REPORT_BYTES)
        return JSONResponse(ota.report(device, load_json(body, "the report")))

    @app.post(
        "/v2/ota/check",
        summary="Report that update checks fail, or succeed again",
        openapi_extra=_CHECK_BODY,
    )
    async def check(request: Request) -> JSONResponse:
        device = authenticate(request)
        body = await read_body(request, MAX_REPORT_BYTES)
        return JSONResponse(ota.check_status(device, load_json(body, "the check status")))
