"""The gateway's error tree and its one status table.

Every error a request can meet maps to one HTTP status and one gRPC status
code, here and nowhere else; both front ends use :func:`status_of`::

    GatewayError
    ├── BadRequest          400  INVALID_ARGUMENT    malformed body, wrong datatype/shape, ...
    ├── Unauthenticated     401  UNAUTHENTICATED     missing, wrong or revoked token
    ├── PermissionDenied    403  PERMISSION_DENIED   the token may not do this
    ├── NotFound            404  NOT_FOUND           unknown model or version
    ├── PayloadTooLarge     413  RESOURCE_EXHAUSTED  body over the configured limit
    ├── RateLimited         429  RESOURCE_EXHAUSTED  the device's rate limit is spent
    ├── Unavailable         503  UNAVAILABLE         model not ready, gateway stopping
    └── DeadlineExceeded    504  DEADLINE_EXCEEDED   the request's deadline passed

Errors of the agent's tree that reach a front end are mapped too (an
``InputError`` is a bad request, a ``ModelNotFoundError`` a 404, a runtime
failure a 500 that names the failure and never carries a traceback).
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_agent.errors import (
    BackendError,
    EdgeError,
    InputError,
    ModelNotFoundError,
    NoVariantError,
    PackageError,
)

__all__ = [
    "BadRequest",
    "DeadlineExceeded",
    "GatewayError",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "Status",
    "Unauthenticated",
    "Unavailable",
    "status_of",
]


class GatewayError(Exception):
    """Base of the errors the gateway answers requests with."""


class BadRequest(GatewayError):
    pass


class Unauthenticated(GatewayError):
    pass


class PermissionDenied(GatewayError):
    pass


class NotFound(GatewayError):
    pass


class PayloadTooLarge(GatewayError):
    pass


class RateLimited(GatewayError):
    pass


class Unavailable(GatewayError):
    pass


class DeadlineExceeded(GatewayError):
    pass


@dataclass(frozen=True)
class Status:
    http: int
    grpc: str  # a grpc.StatusCode member's name
    message: str
    kind: str  # a short label for metrics


_TABLE: list[tuple[type[BaseException], int, str, str]] = [
    (BadRequest, 400, "INVALID_ARGUMENT", "bad_request"),
    (Unauthenticated, 401, "UNAUTHENTICATED", "unauthenticated"),
    (PermissionDenied, 403, "PERMISSION_DENIED", "permission_denied"),
    (NotFound, 404, "NOT_FOUND", "not_found"),
    (PayloadTooLarge, 413, "RESOURCE_EXHAUSTED", "too_large"),
    (RateLimited, 429, "RESOURCE_EXHAUSTED", "rate_limited"),
    (Unavailable, 503, "UNAVAILABLE", "unavailable"),
    (DeadlineExceeded, 504, "DEADLINE_EXCEEDED", "deadline_exceeded"),
    # errors of the agent's tree
    (InputError, 400, "INVALID_ARGUMENT", "bad_request"),
    (ModelNotFoundError, 404, "NOT_FOUND", "not_found"),
    (NoVariantError, 503, "UNAVAILABLE", "unavailable"),
    (PackageError, 503, "UNAVAILABLE", "unavailable"),
    (BackendError, 500, "INTERNAL", "internal"),
    (EdgeError, 500, "INTERNAL", "internal"),
]


def status_of(exc: BaseException) -> Status:
    """The HTTP and gRPC status of an error (500/INTERNAL for anything unexpected)."""
    for kind, http, grpc, label in _TABLE:
        if isinstance(exc, kind):
            return Status(http, grpc, str(exc) or kind.__name__, label)
    return Status(500, "INTERNAL", "internal error", "internal")
