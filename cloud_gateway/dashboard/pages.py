"""The dashboard's pages under ``/ui``: Fleet, Device, Rollouts, Models, sign-in.

Every action is a confirmation page (``GET /ui/confirm``: what it will do, in a
sentence) whose form carries the session's CSRF token to ``POST /ui/act``; signing in
and out are forms too (``/ui/login``, with a token of its own against login CSRF;
``/ui/logout``). A page asked for without a session goes to the sign-in page.

The routes are one router, a function a page or action. Who is asking, and the CSRF
token of an action's form, are dependencies (:func:`signed_in`, :func:`checked_form`)
rather than calls each route makes, so that no page can leave either out; a
dependency that answers in the page's place (the sign-in page, an error page) raises
:class:`~cloud_gateway.dashboard.web.Answered`. The pages are drawn by
:mod:`cloud_gateway.dashboard.web`.
"""

from __future__ import annotations

import logging
import secrets
import urllib.parse
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from cloud_gateway.dashboard.actions import Action, parse_action
from cloud_gateway.dashboard.context import SECURITY_HEADERS, Caller, DashboardContext
from cloud_gateway.dashboard.sessions import COOKIE
from cloud_gateway.dashboard.web import HERE, STATIC, Answered, Pages, answered
from cloud_gateway.fleet.store import blank_status
from cloud_gateway.fleet.views import DEFAULT_PAGE_SIZE
from cloud_gateway.rest.body import read_body
from edge_core.errors import BadRequest, EdgeError, PermissionDenied, Unauthenticated
from edge_core.numbers import integer

__all__ = ["add_page_routes", "router"]

log = logging.getLogger(__name__)

LOGIN_COOKIE = "edge_login"  # the sign-in form's own CSRF token (no session yet)
MAX_FORM_BYTES = 8192

router = APIRouter(include_in_schema=False)


def add_page_routes(app: FastAPI, context: DashboardContext) -> None:
    """Serve the dashboard's pages of ``context`` on ``app``."""
    app.state.dashboard_pages = Pages(context)
    app.add_exception_handler(Answered, answered)
    app.include_router(router)


# -- dependencies: the pages, who is asking, the forms ---------------------------------


async def pages(request: Request) -> Pages:
    """The pages of the application ``request`` came to (:func:`add_page_routes`)."""
    found: Pages = request.app.state.dashboard_pages
    return found


PagesOf = Annotated[Pages, Depends(pages)]


async def maybe_signed_in(request: Request, pages: PagesOf) -> Caller | None:
    """The signed-in admin asking, or ``None`` (no session, or a bearer token: the
    pages take sessions only)."""
    try:
        caller = pages.context.caller(request)
    except (Unauthenticated, PermissionDenied):
        return None
    return caller if caller.session is not None else None


MaybeCaller = Annotated[Caller | None, Depends(maybe_signed_in)]


async def signed_in(request: Request, caller: MaybeCaller) -> Caller:
    """The signed-in admin asking; anyone else is sent to the sign-in page."""
    if caller is None:
        raise Answered(Pages.to_login(request))
    return caller


SignedIn = Annotated[Caller, Depends(signed_in)]


async def form(request: Request) -> dict[str, str]:
    """The fields of a form (at most :data:`MAX_FORM_BYTES`, 20 fields).

    Raises:
        BadRequest: not URL-encoded UTF-8.
        PayloadTooLarge: past the limit.
    """
    body = await read_body(request, MAX_FORM_BYTES)
    try:
        pairs = urllib.parse.parse_qsl(
            body.decode("utf-8"),
            keep_blank_values=True,
            max_num_fields=20,
            strict_parsing=False,
        )
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("a form is application/x-www-form-urlencoded UTF-8") from None
    return dict(pairs)


Form = Annotated[dict[str, str], Depends(form)]


async def checked_form(request: Request, caller: SignedIn, pages: PagesOf) -> dict[str, str]:
    """The fields of a signed-in admin's form that carries the session's CSRF token;
    any other is answered with the error page."""
    try:
        fields = await form(request)
        if caller.session is None or not caller.session.csrf_ok(fields.get("csrf")):
            raise PermissionDenied("the form's CSRF token is wrong: reload the page")
    except EdgeError as exc:
        raise Answered(pages.error(exc, caller)) from None
    return fields


CheckedForm = Annotated[dict[str, str], Depends(checked_form)]


# -- static files and the way in ---------------------------------------------------------


@router.get("/ui/static/{name}")
async def static(name: str) -> Response:
    media = STATIC.get(name)
    if media is None:
        return Response("not found", status_code=404, media_type="text/plain")
    headers = {**SECURITY_HEADERS, "Cache-Control": "public, max-age=3600"}
    return FileResponse(HERE / "static" / name, media_type=media, headers=headers)


@router.get("/ui")
async def home() -> Response:
    return RedirectResponse("/ui/fleet", status_code=303)


def _login_form(pages: Pages, message: str = "", status: int = 200) -> Response:
    """The sign-in page, with a fresh token of its own against login CSRF."""
    token = secrets.token_urlsafe(24)
    response = pages.html("login.html", status, caller=None, login_csrf=token, message=message)
    pages.cookie(response, LOGIN_COOKIE, token, 600, "/ui/login")
    return response


@router.get("/ui/login")
async def login_page(caller: MaybeCaller, pages: PagesOf) -> Response:
    if caller is not None:
        return RedirectResponse("/ui/fleet", status_code=303)
    return _login_form(pages)


@router.post("/ui/login")
async def login(request: Request, fields: Form, pages: PagesOf) -> Response:
    context = pages.context

    def refuse(message: str, status: int) -> Response:
        context.metrics.dashboard_sign_ins.labels("refused").inc()
        return _login_form(pages, message, status)

    expected = request.cookies.get(LOGIN_COOKIE, "")
    if not expected or not secrets.compare_digest(expected, fields.get("login_csrf", "")):
        return refuse("The sign-in form expired: sign in again.", 400)
    try:
        device = context.registry.authenticate(fields.get("token", "").strip() or None)
    except Unauthenticated as exc:
        return refuse(f"Refused: {exc}.", 401)
    if device.role != "admin":
        return refuse(
            f"Refused: {device.id} is a device, and a device's token cannot sign in. Use "
            "an admin token (cloud-gateway device add NAME --group operators --admin).",
            403,
        )
    value, _ = await run_in_threadpool(context.sessions.create, device.id)
    context.metrics.dashboard_sign_ins.labels("ok").inc()
    log.info("dashboard: %s signed in", device.id)
    response = RedirectResponse("/ui/fleet", status_code=303)
    pages.cookie(response, COOKIE, value, int(context.settings.session_max_s), "/")
    response.delete_cookie(LOGIN_COOKIE, path="/ui/login")
    return response


@router.post("/ui/logout")
async def logout(caller: MaybeCaller, fields: Form, pages: PagesOf) -> Response:
    if caller is not None and caller.session is not None:
        if not caller.session.csrf_ok(fields.get("csrf")):
            return pages.error(PermissionDenied("the form's CSRF token is wrong"), caller)
        await run_in_threadpool(pages.context.sessions.end, caller.session)
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


# -- pages -------------------------------------------------------------------------------


def _live(request: Request, name: str) -> str:
    """The template of a page's live part when htmx asks for it (``_name``), else the page."""
    return f"_{name}" if request.headers.get("hx-request") else name


@router.get("/ui/fleet")
async def fleet_page(request: Request, caller: SignedIn, pages: PagesOf) -> Response:
    query = request.query_params
    try:
        page = integer(query.get("page") or "1", "page", 1, 1_000_000, text=True)
        filters = {
            "group": query.get("group") or None,
            "model": query.get("model") or None,
            "state": query.get("health") or None,
        }
        view = await run_in_threadpool(
            pages.context.views.fleet_list, page=page, size=DEFAULT_PAGE_SIZE, **filters
        )
    except EdgeError as exc:
        return pages.error(exc, caller)
    named = (("group", filters["group"]), ("model", filters["model"]),
             ("health", filters["state"]))  # fmt: skip
    here = {key: value for key, value in named if value}
    values: dict[str, Any] = {
        "caller": caller,
        "view": view,
        "query": urllib.parse.urlencode({**here, "page": view["page"]}),
        "here": here,
        "urlencode": urllib.parse.urlencode,
    }
    return pages.html(_live(request, "fleet.html"), **values)


@router.get("/ui/devices/{device_id}")
async def device_page(
    request: Request, device_id: str, caller: SignedIn, pages: PagesOf
) -> Response:
    try:
        view = await run_in_threadpool(pages.context.views.device, device_id)
    except EdgeError as exc:
        return pages.error(exc, caller)
    return pages.html(
        _live(request, "device.html"),
        caller=caller,
        view=view,
        device_status=view["status"] or blank_status(),
    )


@router.get("/ui/rollouts")
async def rollouts_page(request: Request, caller: SignedIn, pages: PagesOf) -> Response:
    views = pages.context.views
    rollouts = await run_in_threadpool(views.rollout_list)
    actions = await run_in_threadpool(views.actions, 20)
    return pages.html(
        _live(request, "rollouts.html"), caller=caller, rollouts=rollouts, actions=actions
    )


@router.get("/ui/models")
async def models_page(caller: SignedIn, pages: PagesOf) -> Response:
    models = await run_in_threadpool(pages.context.views.model_list)
    return pages.html("models.html", caller=caller, models=models)


# -- actions: confirm, then do -----------------------------------------------------------


@router.get("/ui/confirm")
async def confirm(request: Request, caller: SignedIn, pages: PagesOf) -> Response:
    try:
        action = parse_action(dict(request.query_params))
        sentence = await run_in_threadpool(pages.context.operations.describe, action)
    except EdgeError as exc:
        return pages.error(exc, caller)
    return pages.html("confirm.html", caller=caller, action=action, sentence=sentence)


@router.post("/ui/act")
async def act(caller: SignedIn, fields: CheckedForm, pages: PagesOf) -> Response:
    try:
        action: Action = parse_action(fields)
        await run_in_threadpool(pages.context.operations.perform, action, caller.actor)
    except EdgeError as exc:
        return pages.error(exc, caller)
    log.info("dashboard: %s did %s on %s", caller.actor, action.action, action.target)
    return RedirectResponse("/ui/rollouts", status_code=303)
