"""How the dashboard's pages are drawn: Jinja2 templates, autoescaped, and the
headers every page carries.

Server-rendered (Jinja2, autoescaped: every value a device sent is text, never
markup), with htmx (vendored, served from ``/ui/static``) asking for the live part of
a page every ``refresh_s``: a request with ``HX-Request`` gets only that part. No
inline script or style anywhere, so the Content-Security-Policy allows only the
gateway's own two files. The pages themselves, and who may see them, are the routes
of :mod:`cloud_gateway.dashboard.pages`.
"""

from __future__ import annotations

import datetime
import logging
from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from cloud_gateway.dashboard.context import SECURITY_HEADERS, Caller, DashboardContext
from cloud_gateway.fleet.charts import HEIGHT, WIDTH
from cloud_gateway.fleet.health import HEALTH
from edge_core.status import status_of

__all__ = ["HERE", "STATIC", "Answered", "Pages", "answered", "templates"]

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
STATIC = {
    "htmx.min.js": "text/javascript",
    "dashboard.css": "text/css",
}
# htmx 2.0.11, vendored unchanged from the npm registry's htmx.org-2.0.11.tgz
# (package/dist/htmx.min.js; tarball SHA-256 165a2655...add408e); a test checks it.
HTMX_SHA256 = "d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717"


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


class Answered(Exception):
    """A page's answer given by one of its dependencies (the sign-in page for a caller
    without a session, an error page): the route's own body never runs."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


async def answered(request: Request, exc: Exception) -> Response:
    """The exception handler that sends an :class:`Answered`'s response."""
    assert isinstance(exc, Answered)
    return exc.response


class Pages:
    """The pages of one dashboard: its templates, drawn with its settings."""

    def __init__(self, context: DashboardContext) -> None:
        self.context = context
        self.environment = templates()
        self.refresh = context.settings.refresh_s

    def html(self, name: str, status: int = 200, **values: Any) -> HTMLResponse:
        """The template ``name`` drawn with ``values``, with the security headers."""
        body = self.environment.get_template(name).render(refresh=self.refresh, **values)
        headers = {**SECURITY_HEADERS, "Vary": "HX-Request"}
        return HTMLResponse(body, status_code=status, headers=headers)

    def cookie(self, response: Response, name: str, value: str, max_age: int, path: str) -> None:
        """Set a cookie no script reads and no other site sends (Secure over TLS)."""
        response.set_cookie(
            name, value, max_age=max_age, path=path, httponly=True, samesite="strict",
            secure=self.context.secure,
        )  # fmt: skip

    def error(self, exc: BaseException, caller: Caller | None) -> HTMLResponse:
        """The error page for ``exc``, with its status from the one table."""
        status = status_of(exc)
        if status.http >= 500:
            log.error("dashboard: %s", exc)
        return self.html("error.html", status.http, caller=caller, message=status.message,
                         code=status.http)  # fmt: skip

    @staticmethod
    def to_login(request: Request) -> Response:
        """To the sign-in page: a redirect, or for htmx a whole-page one."""
        if request.headers.get("hx-request"):
            return Response(status_code=401, headers={"HX-Redirect": "/ui/login"})
        return RedirectResponse("/ui/login", status_code=303)
