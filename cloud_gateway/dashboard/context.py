"""What the dashboard's pages and API share: who is asking (an admin's bearer token or
a signed-in session), and the headers every answer carries."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from cloud_gateway.auth import DeviceRegistry, parse_bearer
from cloud_gateway.config import DashboardSettings
from cloud_gateway.dashboard.actions import Operations
from cloud_gateway.dashboard.sessions import COOKIE, Session, Sessions
from cloud_gateway.fleet.views import FleetViews
from cloud_gateway.metrics import GatewayMetrics
from edge_core.errors import PermissionDenied, Unauthenticated

__all__ = ["SECURITY_HEADERS", "Caller", "DashboardContext"]

# No script but the gateway's own files, no inline script or style (so a value that
# slipped through escaping still could not run), nothing framed, forms only to itself.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
}


@dataclass(frozen=True)
class Caller:
    actor: str  # the admin's id
    session: Session | None  # None: an admin bearer token (scripts)


@dataclass
class DashboardContext:
    views: FleetViews
    operations: Operations
    sessions: Sessions
    registry: DeviceRegistry
    metrics: GatewayMetrics
    settings: DashboardSettings
    secure: bool  # the gateway serves TLS: the cookie is Secure

    def caller(self, request: Request) -> Caller:
        """The admin asking: by ``Authorization: Bearer`` (an admin token), or by the
        session cookie.

        Raises:
            Unauthenticated: neither, or a wrong, revoked or expired one.
            PermissionDenied: a device's token.
        """
        token = parse_bearer(request.headers.get("authorization"))
        if token is not None:
            device = self.registry.authenticate(token)
            if device.role != "admin":
                raise PermissionDenied(
                    f"{device.id!r} is a device: the dashboard takes an admin token "
                    "(cloud-gateway device add NAME --group operators --admin)"
                )
            return Caller(device.id, None)
        session = self.sessions.lookup(request.cookies.get(COOKIE))
        if session is None:
            raise Unauthenticated("sign in with an admin token (or send it as a bearer token)")
        return Caller(session.actor, session)
