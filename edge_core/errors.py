"""The one error tree of the project: the device (``edge_agent``), the gateway
(``cloud_gateway``) and what they share (``edge_core``).

Every error either side raises derives from :class:`EdgeError`; errors of the
libraries underneath (ONNX Runtime, LiteRT, grpc, paho, httpx, cryptography,
python-tuf, file parsers) are translated at the seam where they are called,
with ``raise ... from exc``, so callers only ever catch these. Every front end
(the gateway's REST, gRPC and MQTT, the agent's local HTTP and gRPC) answers
them with the status :func:`edge_core.status.status_of` gives::

    EdgeError
    ├── ConfigError              a configuration file is missing, malformed or wrong
    │   └── ProfileError         a device profile file
    ├── PackageError             a model package (manifest, variant files) is wrong
    ├── ModelNotFoundError       no model, version or variant by that name
    ├── InputError               the caller's input does not fit the model
    │   └── ProtocolError        a request or response is malformed on the wire
    ├── NoVariantError           no variant of the model can run on this device
    ├── PolicyRejected           the policy refuses the request (the decision says why)
    ├── OffloadError             sending a request to the cloud failed
    │   ├── OffloadUnavailable   the gateway cannot be reached (retried, counts for the breaker)
    │   ├── OffloadTimeout       no answer within the deadline
    │   ├── OffloadRejected      the gateway answered with an error (bad request, auth, ...)
    │   ├── BreakerOpen          too many recent failures: not even tried
    │   └── PrivacyRefusal       the exit guard refused to let the data leave
    ├── UpdateError              an over-the-air model update failed (the current model stays)
    │   ├── MetadataError        signed metadata failed verification (signature, rollback,
    │   │                        freeze, mix-and-match, untrusted key)
    │   ├── DownloadError        a download failed, was cut, or ran past its declared length
    │   │   ├── DownloadRefused  the server's answer cannot be taken as it is (not retried)
    │   │   ├── DownloadStalled  below the minimum rate or past its deadline (resumed later)
    │   │   └── CorruptDownload  the bytes do not match their signed length and hash
    │   │                        (also an IntegrityError)
    │   ├── IntegrityError       a blob's length, hash or authentication tag is wrong
    │   ├── StorageError         the device cannot hold a download (size limit, free space,
    │   │                        the filesystem refused to write)
    │   ├── NoKeyError           no data key this device can unwrap (another group's model)
    │   └── SmokeTestError       the new model failed its smoke test (rolled back)
    ├── BackendError             the inference runtime failed
    │   ├── BackendUnavailableError   the runtime library is not installed
    │   ├── ModelLoadError            the runtime refused the model
    │   └── InferenceError            the runtime failed while running it
    ├── MissingExtraError    a library a feature needs is not installed (names the extra)
    └── RequestError             a server answers a request with this status
        ├── BadRequest           malformed body, name, version, parameter
        ├── Unauthenticated      missing, wrong or revoked token
        ├── PermissionDenied     the token may not do this
        ├── NotFound             unknown model or version
        ├── PayloadTooLarge      body over the configured limit
        ├── RateLimited          the device's rate limit is spent
        ├── Unavailable          model not ready, no engine
        │   ├── Stopping         the server is stopping: no new requests
        │   └── EngineUnavailable   the serving engine behind the gateway cannot be
        │                        reached, is not ready, or is full (its max in flight)
        ├── EngineError          the serving engine behind the gateway failed: its own
        │                        internal error, a credential it refused, a bad answer
        └── DeadlineExceeded     the request's deadline passed
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "BadRequest",
    "BreakerOpen",
    "ConfigError",
    "CorruptDownload",
    "DeadlineExceeded",
    "DownloadError",
    "DownloadRefused",
    "DownloadStalled",
    "EdgeError",
    "EngineError",
    "EngineUnavailable",
    "InferenceError",
    "InputError",
    "IntegrityError",
    "MetadataError",
    "MissingExtraError",
    "ModelLoadError",
    "ModelNotFoundError",
    "NoKeyError",
    "NoVariantError",
    "NotFound",
    "OffloadError",
    "OffloadRejected",
    "OffloadTimeout",
    "OffloadUnavailable",
    "PackageError",
    "PayloadTooLarge",
    "PermissionDenied",
    "PolicyRejected",
    "PrivacyRefusal",
    "ProfileError",
    "ProtocolError",
    "RateLimited",
    "RequestError",
    "SmokeTestError",
    "Stopping",
    "StorageError",
    "Unauthenticated",
    "Unavailable",
    "UpdateError",
]


class EdgeError(Exception):
    """Base of every error the project raises."""


class ConfigError(EdgeError):
    """A configuration file is missing, malformed or holds a wrong value.

    The message names the file, the field (a dotted path) and what was
    expected, e.g. ``rpi.toml: runtime.threads: expected an integer >= 1, got 'four'``.
    """

    def __init__(
        self, message: str, *, path: Path | str | None = None, field: str | None = None
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.field = field
        self.reason = message
        prefix = ""
        if self.path is not None:
            prefix += f"{self.path}: "
        if field:
            prefix += f"{field}: "
        super().__init__(prefix + message)


class ProfileError(ConfigError):
    """A device profile file is malformed or holds a wrong value."""


class PackageError(EdgeError):
    """A model package is malformed: its manifest, or a file it names."""


class ModelNotFoundError(EdgeError):
    """No model, version or variant by the requested name."""


class InputError(EdgeError):
    """The caller's input does not fit the model.

    ``input_name`` names the offending input (``None`` when the problem is
    with the request as a whole).
    """

    def __init__(self, message: str, *, input_name: str | None = None) -> None:
        self.input_name = input_name
        super().__init__(message)


class ProtocolError(InputError):
    """A request or response is malformed on the wire (JSON, binary tensors, protobuf)."""


class NoVariantError(EdgeError):
    """No variant of the model can run with the runtimes and profile at hand."""


class BackendError(EdgeError):
    """The inference runtime (ONNX Runtime, LiteRT) failed."""


class BackendUnavailableError(BackendError):
    """The runtime library a variant needs is not installed."""


class ModelLoadError(BackendError):
    """The runtime refused to load the model."""


class InferenceError(BackendError):
    """The runtime failed while running the model."""


class MissingExtraError(EdgeError):
    """A library a feature needs is not installed; the message names the extra of
    ``edge-inference`` that brings it (a device installs only what its profile uses)."""


class PolicyRejected(EdgeError):
    """The policy refuses the request; ``decision`` says why."""

    def __init__(self, message: str, *, decision: object = None) -> None:
        self.decision = decision
        super().__init__(message)


class OffloadError(EdgeError):
    """Sending a request to the cloud failed."""


class OffloadUnavailable(OffloadError):
    """The gateway cannot be reached (connection refused, UNAVAILABLE, 502/503)."""


class OffloadTimeout(OffloadError):
    """The gateway did not answer within the request's deadline."""


class OffloadRejected(OffloadError):
    """The gateway answered with an error; ``status`` is its HTTP status or gRPC code."""

    def __init__(self, message: str, *, status: str = "") -> None:
        self.status = status
        super().__init__(message)


class BreakerOpen(OffloadError):
    """The circuit breaker is open after repeated failures: the request was not sent."""


class PrivacyRefusal(OffloadError):
    """The exit guard refused to send data that may not leave the device as it is."""


class UpdateError(EdgeError):
    """An over-the-air model update failed; the device keeps its current model."""


class MetadataError(UpdateError):
    """Signed update metadata failed verification."""


class DownloadError(UpdateError):
    """A download failed, was cut off, or ran past its declared length."""


class DownloadRefused(DownloadError):
    """The server's answer was refused as it is (more than the signed length, or an
    encoded body): asking again cannot help. ``discard``: what was received of it
    is worthless too."""

    def __init__(self, message: str, *, discard: bool = False) -> None:
        super().__init__(message)
        self.discard = discard


class DownloadStalled(DownloadError):
    """A download fell below its minimum rate or ran past its deadline and was abandoned:
    what arrived is kept, and the next check resumes it."""


class IntegrityError(UpdateError):
    """A blob's length, hash or authentication tag is wrong."""


class CorruptDownload(DownloadError, IntegrityError):
    """What was downloaded does not match its signed length and hash (changed in transit
    or by the server): it is discarded, and the next check fetches it again."""


class StorageError(UpdateError):
    """The device cannot hold a download: it is over the configured maximum size or the
    process's file-size limit, there is not enough free space, or the filesystem refused
    to write (``ENOSPC``, ``EFBIG``). What was written of it is removed."""


class NoKeyError(UpdateError):
    """No data key this device can unwrap: the model is for another group."""


class SmokeTestError(UpdateError):
    """The new model failed its smoke test and was not activated."""


class RequestError(EdgeError):
    """A server answers the request with the status of this error's class."""


class BadRequest(RequestError):
    pass


class Unauthenticated(RequestError):
    pass


class PermissionDenied(RequestError):
    pass


class NotFound(RequestError):
    pass


class PayloadTooLarge(RequestError):
    pass


class RateLimited(RequestError):
    pass


class Unavailable(RequestError):
    pass


class Stopping(Unavailable):
    """The server is stopping: no new requests."""


class DeadlineExceeded(RequestError):
    pass


class EngineUnavailable(Unavailable):
    """The serving engine behind the gateway cannot be reached or is not ready."""


class EngineError(RequestError):
    """The serving engine behind the gateway failed (not the caller's fault, nor a
    state that passes by itself): its internal error, a credential of the gateway's
    that it refused, an answer that is not the protocol."""
