"""The dashboard's pages under ``/ui``: Fleet, Device, Rollouts, Models, sign-in.

Server-rendered (Jinja2, autoescaped: every value a device sent is text, never
markup), with htmx (vendored, served from ``/ui/static``) asking for the live part of
a page every ``refresh_s``: a request with ``HX-Request`` gets only that part. No
inline script or style anywhere, so the Content-Security-Policy allows only the
gateway's own two files.

Every action is a confirmation page (``GET /ui/confirm``: what it will do, in a
sentence) whose form carries the session's CSRF token to ``POST /ui/act``; signing in
and out are forms too (``/ui/login``, with a token of its own against login CSRF;
``/ui/logout``). A page asked for without a session goes to the sign-in page.
"""

from __future__ import annotations

import datetime
import logging
import secrets
import urllib.parse
from pathlib import Path
from typing import Any

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from cloud_gateway.dashboard.actions import Action, parse_action
from cloud_gateway.dashboard.context import SECURITY_HEADERS, Caller, DashboardContext
from cloud_gateway.dashboard.sessions import COOKIE
from cloud_gateway.fleet.charts import HEIGHT, WIDTH
from cloud_gateway.fleet.health import HEALTH
from cloud_gateway.fleet.store import blank_status
from cloud_gateway.fleet.views import DEFAULT_PAGE_SIZE
from cloud_gateway.rest.body import read_body
from edge_core.errors import BadRequest, EdgeError, PermissionDenied, Unauthenticated
from edge_core.numbers import integer
from edge_core.status import status_of

__all__ = ["add_page_routes", "templates"]

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
STATIC = {
    "htmx.min.js": "text/javascript",
    "dashboard.css": "text/css",
}
# htmx 2.0.11, vendored unchanged from the npm registry's htmx.org-2.0.11.tgz
# (package/dist/htmx.min.js; tarball SHA-256 165a2655...add408e); a test checks it.
HTMX_SHA256 = "d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717"
LOGIN_COOKIE = "edge_login"  # the sign-in form's own CSRF token (no session yet)
MAX_FORM_BYTES = 8192


def _when(at: float | None) -> str:
    if not at:
        return "never"
    moment = datetime.datetime.fromtimestamp(at, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _number(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}".rstrip("0").rstrip(".") or "0"
    return str(value)


def _size(value: Any) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "–"
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def templates() -> jinja2.Environment:
    """The pages' templates: autoescaped always (HTML and SVG alike), undefined names
    an error."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(when=_when, number=_number, size=_size)
    environment.globals.update(HEALTH=HEALTH, WIDTH=WIDTH, HEIGHT=HEIGHT)
    return environment


def add_page_routes(app: FastAPI, context: DashboardContext) -> None:
    environment = templates()
    views, operations = context.views, context.operations
    refresh = context.settings.refresh_s

    def html(name: str, status: int = 200, **values: Any) -> HTMLResponse:
        body = environment.get_template(name).render(refresh=refresh, **values)
        headers = {**SECURITY_HEADERS, "Vary": "HX-Request"}
        return HTMLResponse(body, status_code=status, headers=headers)

    def cookie(response: Response, name: str, value: str, max_age: int, path: str) -> None:
        response.set_cookie(
            name, value, max_age=max_age, path=path, httponly=True, samesite="strict",
            secure=context.secure,
        )  # fmt: skip

    def signed_in(request: Request) -> Caller | None:
        try:
            caller = context.caller(request)
        except (Unauthenticated, PermissionDenied):
            return None
        return caller if caller.session is not None else None

    def to_login(request: Request) -> Response:
        if request.headers.get("hx-request"):  # htmx: a whole-page redirect
            return Response(status_code=401, headers={"HX-Redirect": "/ui/login"})
        return RedirectResponse("/ui/login", status_code=303)

    def error(exc: BaseException, caller: Caller | None) -> HTMLResponse:
        status = status_of(exc)
        if status.http >= 500:
            log.error("dashboard: %s", exc)
        return html("error.html", status.http, caller=caller, message=status.message,
                    code=status.http)  # fmt: skip

    async def form(request: Request) -> dict[str, str]:
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

    # -- static files and the way in --------------------------------------------------

    @app.get("/ui/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        media = STATIC.get(name)
        if media is None:
            return Response("not found", status_code=404, media_type="text/plain")
        headers = {**SECURITY_HEADERS, "Cache-Control": "public, max-age=3600"}
        return FileResponse(HERE / "static" / name, media_type=media, headers=headers)

    @app.get("/ui", include_in_schema=False)
    async def home() -> Response:
        return RedirectResponse("/ui/fleet", status_code=303)

    @app.get("/ui/login", include_in_schema=False)
    async def login_page(request: Request) -> Response:
        if signed_in(request) is not None:
            return RedirectResponse("/ui/fleet", status_code=303)
        token = secrets.token_urlsafe(24)
        response = html("login.html", caller=None, login_csrf=token, message="")
        cookie(response, LOGIN_COOKIE, token, 600, "/ui/login")
        return response

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        fields = await form(request)
        expected = request.cookies.get(LOGIN_COOKIE, "")
        token = secrets.token_urlsafe(24)

        def refuse(message: str, status: int) -> Response:
            context.metrics.dashboard_sign_ins.labels("refused").inc()
            response = html("login.html", status, caller=None, login_csrf=token, message=message)
            cookie(response, LOGIN_COOKIE, token, 600, "/ui/login")
            return response

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
        cookie(response, COOKIE, value, int(context.settings.session_max_s), "/")
        response.delete_cookie(LOGIN_COOKIE, path="/ui/login")
        return response

    @app.post("/ui/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        caller = signed_in(request)
        fields = await form(request)
        if caller is not None and caller.session is not None:
            if not caller.session.csrf_ok(fields.get("csrf")):
                return error(PermissionDenied("the form's CSRF token is wrong"), caller)
            await run_in_threadpool(context.sessions.end, caller.session)
        response = RedirectResponse("/ui/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # -- pages ------------------------------------------------------------------------

    @app.get("/ui/fleet", include_in_schema=False)
    async def fleet_page(request: Request) -> Response:
        caller = signed_in(request)
        if caller is None:
            return to_login(request)
        query = request.query_params
        try:
            page = integer(query.get("page") or "1", "page", 1, 1_000_000, text=True)
            filters = {
                "group": query.get("group") or None,
                "model": query.get("model") or None,
                "state": query.get("health") or None,
            }
            view = await run_in_threadpool(
                views.fleet_list, page=page, size=DEFAULT_PAGE_SIZE, **filters
            )
        except EdgeError as exc:
            return error(exc, caller)
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
        if request.headers.get("hx-request"):
            return html("_fleet.html", **values)
        return html("fleet.html", **values)

    @app.get("/ui/devices/{device_id}", include_in_schema=False)
    async def device_page(request: Request, device_id: str) -> Response:
        caller = signed_in(request)
        if caller is None:
            return to_login(request)
        try:
            view = await run_in_threadpool(views.device, device_id)
        except EdgeError as exc:
            return error(exc, caller)
        name = "_device.html" if request.headers.get("hx-request") else "device.html"
        return html(name, caller=caller, view=view, device_status=view["status"] or blank_status())

    @app.get("/ui/rollouts", include_in_schema=False)
    async def rollouts_page(request: Request) -> Response:
        caller = signed_in(request)
        if caller is None:
            return to_login(request)
        rollouts = await run_in_threadpool(views.rollout_list)
        actions = await run_in_threadpool(views.actions, 20)
        name = "_rollouts.html" if request.headers.get("hx-request") else "rollouts.html"
        return html(name, caller=caller, rollouts=rollouts, actions=actions)

    @app.get("/ui/models", include_in_schema=False)
    async def models_page(request: Request) -> Response:
        caller = signed_in(request)
        if caller is None:
            return to_login(request)
        models = await run_in_threadpool(views.model_list)
        return html("models.html", caller=caller, models=models)

    # -- actions: confirm, then do ----------------------------------------------------

    @app.get("/ui/confirm", include_in_schema=False)
    async def confirm(request: Request) -> Response:
        caller = signed_in(request)
        if caller is None:
            return to_login(request)
        try:
            action = parse_action(dict(request.query_params))
            sentence = await run_in_threadpool(operations.describe, action)
        except EdgeError as exc:
            return error(exc, caller)
        return html("confirm.html", caller=caller, action=action, sentence=sentence)

    @app.post("/ui/act", include_in_schema=False)
    async def act(request: Request) -> Response:
        caller = signed_in(request)
        if caller is None or caller.session is None:
            return to_login(request)
        try:
            fields = await form(request)
            if not caller.session.csrf_ok(fields.get("csrf")):
                raise PermissionDenied("the form's CSRF token is wrong: reload the page")
            action: Action = parse_action(fields)
            await run_in_threadpool(operations.perform, action, caller.actor)
        except EdgeError as exc:
            return error(exc, caller)
        log.info("dashboard: %s did %s on %s", caller.actor, action.action, action.target)
        return RedirectResponse("/ui/rollouts", status_code=303)
