"""The dashboard's JSON API, ``/api/...``: the views its pages show, for scripts, and
the rollout actions. Admin only: an admin's bearer token, or a signed-in session (whose
actions must carry its CSRF token in ``X-CSRF-Token``). Errors are the gateway's
``{"error": ...}`` with the status of the one table (:mod:`edge_core.status`).

The routes are one router, every route of which depends on :func:`admin` (who is
asking) and an action on :func:`acting_admin` (its CSRF token), so that no route can
leave either out."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from cloud_gateway.auth import DEVICE_ID
from cloud_gateway.dashboard.actions import parse_action
from cloud_gateway.dashboard.context import SECURITY_HEADERS, Caller, DashboardContext
from cloud_gateway.fleet.health import HEALTH
from cloud_gateway.fleet.views import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from cloud_gateway.rest.body import read_body
from edge_core.errors import BadRequest, PermissionDenied
from edge_core.names import MAX_VERSION, MODEL_NAME_PATTERN
from edge_core.protocol.rest import load_json

__all__ = ["add_api_routes", "router"]

MAX_ACTION_BYTES = 4096


def _json(document: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(document, status_code=status, headers=SECURITY_HEADERS)


def add_api_routes(app: FastAPI, context: DashboardContext) -> None:
    """Serve the dashboard's API of ``context`` on ``app``."""
    app.state.dashboard = context
    app.include_router(router)


async def dashboard(request: Request) -> DashboardContext:
    """The dashboard of the application ``request`` came to (:func:`add_api_routes`)."""
    context: DashboardContext = request.app.state.dashboard
    return context


Dashboard = Annotated[DashboardContext, Depends(dashboard)]


async def admin(request: Request, context: Dashboard) -> Caller:
    """The admin asking (a bearer token or a session).

    Raises:
        Unauthenticated, PermissionDenied: see :meth:`DashboardContext.caller`.
    """
    return context.caller(request)


Admin = Annotated[Caller, Depends(admin)]
router = APIRouter(dependencies=[Depends(admin)])  # every route: admins only


async def acting_admin(request: Request, caller: Admin) -> Caller:
    """The admin asking for an action: a session's must carry its CSRF token in
    ``X-CSRF-Token`` (a bearer token is not sent by a browser on its own).

    Raises:
        PermissionDenied: a session's action without its token.
    """
    if caller.session is not None and not caller.session.csrf_ok(
        request.headers.get("x-csrf-token")
    ):
        raise PermissionDenied("a signed-in session's action needs its X-CSRF-Token")
    return caller


@router.get("/api/fleet", summary="The fleet: a page of devices and the counts by health")
async def fleet(
    context: Dashboard,
    group: str | None = Query(None, max_length=64),
    model: str | None = Query(None, max_length=220),
    health: str | None = Query(None, description=f"one of {', '.join(HEALTH)}"),
    page: int = Query(1, ge=1, le=1_000_000),
    size: int = Query(DEFAULT_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE),
) -> JSONResponse:
    document = await run_in_threadpool(
        context.views.fleet_list, group=group, model=model, state=health, page=page, size=size
    )
    return _json(document)


@router.get("/api/devices/{device_id}", summary="One device: status, health, history, reports")
async def device(device_id: str, context: Dashboard) -> JSONResponse:
    document = await run_in_threadpool(context.views.device, device_id)
    charts = document.pop("charts")
    document["charts"] = [
        {"title": c.title, "unit": c.unit, "series": [s.name for s in c.series]} for c in charts
    ]
    return _json(document)


@router.get("/api/rollouts", summary="Every rollout with its slice and its counts")
async def rollouts(context: Dashboard) -> JSONResponse:
    return _json({"rollouts": await run_in_threadpool(context.views.rollout_list)})


@router.get("/api/models", summary="Models: served versions, published versions, who runs which")
async def models(context: Dashboard) -> JSONResponse:
    return _json({"models": await run_in_threadpool(context.views.model_list)})


@router.get("/api/actions", summary="The operators' actions, newest first")
async def actions(context: Dashboard, limit: int = Query(50, ge=1, le=500)) -> JSONResponse:
    return _json({"actions": await run_in_threadpool(context.views.actions, limit)})


_ACTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["action", "name", "version", "group"],
    "properties": {
        "action": {"enum": ["start", "raise", "pause", "resume", "abort"]},
        "name": {"type": "string", "pattern": MODEL_NAME_PATTERN},
        "version": {"type": "integer", "minimum": 1, "maximum": MAX_VERSION},
        "group": {"type": "string", "pattern": DEVICE_ID.pattern},
        "percent": {"type": "number", "minimum": 0, "maximum": 100},
        "failure_threshold": {"type": "number", "minimum": 0, "maximum": 100},
    },
}
_ACTION_BODY: dict[str, Any] = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": _ACTION_SCHEMA}}}
}


@router.post(
    "/api/rollouts/actions",
    summary="Start, raise, pause, resume or abort a rollout (recorded with who did it)",
    openapi_extra=_ACTION_BODY,
)
async def act(
    request: Request, caller: Annotated[Caller, Depends(acting_admin)], context: Dashboard
) -> JSONResponse:
    body = load_json(await read_body(request, MAX_ACTION_BYTES), "the action")
    if not isinstance(body, dict):
        raise BadRequest("an action is a JSON object")
    action = parse_action(body)
    rollout = await run_in_threadpool(context.operations.perform, action, caller.actor)
    return _json({"done": action.action, "by": caller.actor, "rollout": rollout.to_dict()})
