"""The one status table: every error a request can meet maps to one HTTP status,
one gRPC status code and one short kind (a metric label), here and nowhere
else. Every front end uses :func:`status_of`: the gateway's REST, gRPC and
MQTT bridge, and the agent's local HTTP and gRPC API.

A message never carries a traceback; an error outside the tree is a bug,
answered 500 / INTERNAL with ``internal error`` and nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_core.errors import (
    BackendError,
    BadRequest,
    DeadlineExceeded,
    EdgeError,
    EngineError,
    EngineUnavailable,
    InputError,
    MissingExtraError,
    ModelNotFoundError,
    NotFound,
    NoVariantError,
    OffloadError,
    OffloadRejected,
    OffloadTimeout,
    PackageError,
    PayloadTooLarge,
    PermissionDenied,
    PolicyRejected,
    PrivacyRefusal,
    RateLimited,
    Stopping,
    Unauthenticated,
    Unavailable,
)

__all__ = ["Status", "status_of"]


@dataclass(frozen=True)
class Status:
    http: int
    grpc: str  # a grpc.StatusCode member's name
    message: str
    kind: str  # a short label for metrics


# the first match wins: subclasses before their bases
_TABLE: list[tuple[type[BaseException], int, str, str]] = [
    (BadRequest, 400, "INVALID_ARGUMENT", "bad_request"),
    (Unauthenticated, 401, "UNAUTHENTICATED", "unauthenticated"),
    (PermissionDenied, 403, "PERMISSION_DENIED", "permission_denied"),
    (NotFound, 404, "NOT_FOUND", "not_found"),
    (PayloadTooLarge, 413, "RESOURCE_EXHAUSTED", "too_large"),
    (RateLimited, 429, "RESOURCE_EXHAUSTED", "rate_limited"),
    (Stopping, 503, "UNAVAILABLE", "stopping"),
    # a remote engine's: down or full (retryable), or failed (502: the gateway's
    # upstream failed, not the caller; INTERNAL, as the engine said or should have)
    (EngineUnavailable, 503, "UNAVAILABLE", "engine_unavailable"),
    (EngineError, 502, "INTERNAL", "engine_error"),
    (Unavailable, 503, "UNAVAILABLE", "unavailable"),
    (DeadlineExceeded, 504, "DEADLINE_EXCEEDED", "deadline_exceeded"),
    # the device's: the policy and the exit guard refuse, the cloud fails
    (PrivacyRefusal, 403, "PERMISSION_DENIED", "refused"),
    (PolicyRejected, 403, "PERMISSION_DENIED", "refused"),
    (OffloadTimeout, 504, "DEADLINE_EXCEEDED", "deadline_exceeded"),
    (OffloadError, 503, "UNAVAILABLE", "unavailable"),
    # the shared ones
    (InputError, 400, "INVALID_ARGUMENT", "bad_request"),
    (ModelNotFoundError, 404, "NOT_FOUND", "not_found"),
    (NoVariantError, 503, "UNAVAILABLE", "unavailable"),
    (PackageError, 503, "UNAVAILABLE", "unavailable"),
    # what this install lacks: the request is fine, the device cannot serve it
    (MissingExtraError, 501, "UNIMPLEMENTED", "not_installed"),
    (BackendError, 500, "INTERNAL", "internal"),
    (EdgeError, 500, "INTERNAL", "internal"),
]


# A client's error that the gateway found stands as the gateway said it (the agent
# forwarded the request as it came); anything else it refused is the link's failure.
_PASSED_ON: dict[str, tuple[int, str, str]] = {
    "400": (400, "INVALID_ARGUMENT", "bad_request"),
    "INVALID_ARGUMENT": (400, "INVALID_ARGUMENT", "bad_request"),
    "404": (404, "NOT_FOUND", "not_found"),
    "NOT_FOUND": (404, "NOT_FOUND", "not_found"),
    "413": (413, "RESOURCE_EXHAUSTED", "too_large"),
}


def status_of(exc: BaseException) -> Status:
    """The HTTP and gRPC status of an error (500/INTERNAL for anything unexpected)."""
    if isinstance(exc, OffloadRejected) and exc.status in _PASSED_ON:
        http, grpc, label = _PASSED_ON[exc.status]
        return Status(http, grpc, str(exc), label)
    for kind, http, grpc, label in _TABLE:
        if isinstance(exc, kind):
            return Status(http, grpc, str(exc) or kind.__name__, label)
    return Status(500, "INTERNAL", "internal error", "internal")
