"""The dashboard's JSON API, ``/api/...``: the views its pages show, for scripts, and
the rollout actions. Admin only: an admin's bearer token, or a signed-in session (whose
actions must carry its CSRF token in ``X-CSRF-Token``). Errors are the gateway's
``{"error": ...}`` with the status of the one table (:mod:`edge_core.status`)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from cloud_gateway.auth import DEVICE_ID
from cloud_gateway.dashboard.actions import parse_action
from cloud_gateway.dashboard.context import SECURITY_HEADERS, DashboardContext
from cloud_gateway.fleet.health import HEALTH
from cloud_gateway.fleet.views import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from cloud_gateway.rest.body import read_body
from edge_core.errors import BadRequest, PermissionDenied
from edge_core.names import MAX_VERSION, MODEL_NAME_PATTERN
from edge_core.protocol.rest import load_json

__all__ = ["add_api_routes"]

MAX_ACTION_BYTES = 4096


def _json(document: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(document, status_code=status, headers=SECURITY_HEADERS)


def add_api_routes(app: FastAPI, context: DashboardContext) -> None:
    views = context.views

    @app.get("/api/fleet", summary="The fleet: a page of devices and the counts by health")
    async def fleet(
        request: Request,
        group: str | None = Query(None, max_length=64),
        model: str | None = Query(None, max_length=220),
        health: str | None = Query(None, description=f"one of {', '.join(HEALTH)}"),
        page: int = Query(1, ge=1, le=1_000_000),
        size: int = Query(DEFAULT_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE),
    ) -> JSONResponse:
        context.caller(request)
        document = await run_in_threadpool(
            views.fleet_list, group=group, model=model, state=health, page=page, size=size
        )
        return _json(document)

    @app.get("/api/devices/{device_id}", summary="One device: status, health, history, reports")
    async def device(request: Request, device_id: str) -> JSONResponse:
        context.caller(request)
        document = await run_in_threadpool(views.device, device_id)
        charts = document.pop("charts")
        document["charts"] = [
            {"title": c.title, "unit": c.unit, "series": [s.name for s in c.series]} for c in charts
        ]
        return _json(document)

    @app.get("/api/rollouts", summary="Every rollout with its slice and its counts")
    async def rollouts(request: Request) -> JSONResponse:
        context.caller(request)
        return _json({"rollouts": await run_in_threadpool(views.rollout_list)})

    @app.get("/api/models", summary="Models: served versions, published versions, who runs which")
    async def models(request: Request) -> JSONResponse:
        context.caller(request)
        return _json({"models": await run_in_threadpool(views.model_list)})

    @app.get("/api/actions", summary="The operators' actions, newest first")
    async def actions(request: Request, limit: int = Query(50, ge=1, le=500)) -> JSONResponse:
        context.caller(request)
        return _json({"actions": await run_in_threadpool(views.actions, limit)})

    @app.post(
        "/api/rollouts/actions",
        summary="Start, raise, pause, resume or abort a rollout (recorded with who did it)",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["action", "name", "version", "group"],
                            "properties": {
                                "action": {"enum": ["start", "raise", "pause", "resume",
                                                    "abort"]},
                                "name": {"type": "string", "pattern": MODEL_NAME_PATTERN},
                                "version": {"type": "integer", "minimum": 1,
                                            "maximum": MAX_VERSION},
                                "group": {"type": "string", "pattern": DEVICE_ID.pattern},
                                "percent": {"type": "number", "minimum": 0, "maximum": 100},
                                "failure_threshold": {"type": "number", "minimum": 0,
                                                      "maximum": 100},
                            },
                        }
                    }
                },
            }
        },
    )  # fmt: skip
    async def act(request: Request) -> JSONResponse:
        caller = context.caller(request)
        if caller.session is not None and not caller.session.csrf_ok(
            request.headers.get("x-csrf-token")
        ):
            raise PermissionDenied("a signed-in session's action needs its X-CSRF-Token")
        body = load_json(await read_body(request, MAX_ACTION_BYTES), "the action")
        if not isinstance(body, dict):
            raise BadRequest("an action is a JSON object")
        action = parse_action(body)
        rollout = await run_in_threadpool(context.operations.perform, action, caller.actor)
        return _json({"done": action.action, "by": caller.actor, "rollout": rollout.to_dict()})
