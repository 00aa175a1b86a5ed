"""Clients of a remote Open Inference Protocol engine, on the event loop.

:class:`Engine` is the seam (``ready``, ``index``, ``metadata``, ``infer``, all
coroutines): :class:`GrpcEngine` speaks ``inference.GRPCInferenceService``
through ``grpc.aio`` with the shared protobuf codec
(:func:`~edge_core.protocol.grpc.request_to_proto`,
:func:`~edge_core.protocol.grpc.response_from_proto`); :class:`HttpEngine`
speaks the REST protocol with the binary tensor extension through a small
HTTP/1.1 client on asyncio streams (:mod:`cloud_gateway.remote.http1`; why not
httpx is said there) with the shared REST codec
(:func:`~edge_core.protocol.rest.encode_infer_request`,
:func:`~edge_core.protocol.rest.decode_infer_response`). Neither needs a
thread: requests to the engine never take one of the gateway's inference
workers.

Each translates its library's errors here, into the one error tree, so that
what the engine said reaches the device through the one status table:

=======================  ==================  ===========================
the engine answered       gRPC                 the device gets
=======================  ==================  ===========================
a bad request             INVALID_ARGUMENT     400 / INVALID_ARGUMENT
no such model             NOT_FOUND            404 / NOT_FOUND
too busy, down, refused   UNAVAILABLE,         503 / UNAVAILABLE
                          RESOURCE_EXHAUSTED   (:class:`EngineUnavailable`)
past the deadline         DEADLINE_EXCEEDED    504 / DEADLINE_EXCEEDED
anything else             INTERNAL, ...        502 / INTERNAL (:class:`EngineError`)
=======================  ==================  ===========================

(HTTP: 400 and 422 are bad requests, 404 not found, 429, 502 and 503 busy
or down, 408 and 504 past the deadline, anything else an engine error.)
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Any
from urllib.parse import quote

from cloud_gateway.config import BackendSettings
from edge_core.errors import (
    BadRequest,
    DeadlineExceeded,
    EngineError,
    EngineUnavailable,
    NotFound,
    ProtocolError,
    RequestError,
)
from edge_core.protocol.types import InferRequest, InferResponse, RequestedOutput
from edge_core.tls import client_context, grpc_credentials

__all__ = ["Engine", "EngineUnreachable", "GrpcEngine", "HttpEngine", "make_engine"]

_SERVICE = "/inference.GRPCInferenceService/"


class EngineUnreachable(EngineUnavailable):
    """The engine cannot be reached at all (not merely full): its models go unready."""


class Engine(ABC):
    """One remote engine. Every method raises only :class:`RequestError` subclasses."""

    def __init__(self, settings: BackendSettings, token: str | None) -> None:
        self.settings = settings
        self.token = token
        self.name = settings.name or settings.url

    @abstractmethod
    async def ready(self) -> bool:
        """Whether the engine says it is ready (``False`` when it cannot be reached)."""

    async def prepare(self) -> None:  # noqa: B027 - most engines need nothing
        """Learn what the engine supports (before its models are discovered)."""

    @abstractmethod
    async def index(self) -> list[dict[str, str]]:
        """The engine's repository index: ``name``, ``version``, ``state`` per entry."""

    @abstractmethod
    async def metadata(self, name: str, version: str) -> dict[str, Any]:
        """A model's metadata: ``name``, ``versions``, ``platform``, ``inputs``, ``outputs``
        (each tensor ``name``, ``datatype``, ``shape``)."""

    @abstractmethod
    async def infer(self, request: InferRequest, timeout: float) -> InferResponse:
        """Run ``request`` on the engine within ``timeout`` seconds."""

    async def close(self) -> None:  # noqa: B027 - an engine without connections needs nothing
        """Close the connections to the engine."""


# -- gRPC ----------------------------------------------------------------------------------

_GRPC_ERRORS: dict[str, type[RequestError]] = {
    "INVALID_ARGUMENT": BadRequest,
    "OUT_OF_RANGE": BadRequest,
    "NOT_FOUND": NotFound,
    "UNAVAILABLE": EngineUnreachable,
    "RESOURCE_EXHAUSTED": EngineUnavailable,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
}


class GrpcEngine(Engine):
    def __init__(self, settings: BackendSettings, token: str | None) -> None:
        import grpc

        from edge_core.protocol.grpc import pb

        super().__init__(settings, token)
        self._grpc = grpc
        self._pb = pb()
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.keepalive_time_ms", 30_000),
            # an engine back from a restart is used again within a health check or two
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1_000),
            ("grpc.min_reconnect_backoff_ms", 100),
        ]
        tls = settings.tls
        if tls is None:
            self._channel = grpc.aio.insecure_channel(settings.address, options=options)
        else:
            credentials = grpc_credentials(tls, options)
            self._channel = grpc.aio.secure_channel(settings.address, credentials, options=options)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._calls: dict[str, Any] = {}

    def _call(self, method: str, response: str) -> Any:
        call = self._calls.get(method)
        if call is None:
            call = self._calls[method] = self._channel.unary_unary(
                _SERVICE + method,
                request_serializer=lambda message: message.SerializeToString(),
                response_deserializer=getattr(self._pb, response).FromString,
            )
        return call

    async def _unary(self, method: str, message: Any, timeout: float) -> Any:
        grpc = self._grpc
        try:
            return await self._call(method, method + "Response")(
                message, timeout=max(timeout, 0.001), metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
            details = exc.details() or code
            error = _GRPC_ERRORS.get(code, EngineError)
            if error is DeadlineExceeded:
                details = f"no answer within {timeout:.3f} s"
            raise error(f"engine {self.name}: {details}") from exc

    async def ready(self) -> bool:
        try:
            answer = await self._unary(
                "ServerReady", self._pb.ServerReadyRequest(), self.settings.connect_timeout_s
            )
        except RequestError:
            return False
        return bool(answer.ready)

    async def index(self) -> list[dict[str, str]]:
        answer = await self._unary(
            "RepositoryIndex", self._pb.RepositoryIndexRequest(), self.settings.timeout_s
        )
        return [{"name": m.name, "version": m.version, "state": m.state} for m in answer.models]

    async def metadata(self, name: str, version: str) -> dict[str, Any]:
        answer = await self._unary(
            "ModelMetadata",
            self._pb.ModelMetadataRequest(name=name, version=version),
            self.settings.timeout_s,
        )

        def tensors(items: Any) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in items]

        return {
            "name": answer.name,
            "versions": list(answer.versions),
            "platform": answer.platform,
            "inputs": tensors(answer.inputs),
            "outputs": tensors(answer.outputs),
        }

    async def infer(self, request: InferRequest, timeout: float) -> InferResponse:
        from edge_core.protocol.grpc import request_to_proto, response_from_proto

        # the deadline travels as the gRPC deadline (grpc-timeout), which engines keep
        answer = await self._unary("ModelInfer", request_to_proto(request), timeout)
        try:
            return response_from_proto(answer)
        except ProtocolError as exc:
            raise EngineError(f"engine {self.name}: a malformed answer: {exc}") from exc

    async def close(self) -> None:
        await self._channel.close()


# -- HTTP ----------------------------------------------------------------------------------

_HTTP_ERRORS: dict[int, type[RequestError]] = {
    400: BadRequest,
    422: BadRequest,
    404: NotFound,
    429: EngineUnavailable,
    502: EngineUnavailable,
    503: EngineUnavailable,
    408: DeadlineExceeded,
    504: DeadlineExceeded,
}


class HttpEngine(Engine):
    def __init__(self, settings: BackendSettings, token: str | None) -> None:
        from cloud_gateway.remote.http1 import Client

        super().__init__(settings, token)
        # one connection per request in flight: HTTP/1.1 answers one at a time
        self._client = Client(
            settings.address,
            size=settings.max_in_flight,
            headers={"Authorization": f"Bearer {token}"} if token else None,
            context=None if settings.tls is None else client_context(settings.tls),
            connect_timeout=settings.connect_timeout_s,
        )
        self.binary = True  # the binary tensor extension, unless the engine lacks it

    async def _send(
        self,
        method: str,
        path: str,
        timeout: float,
        body: bytes | tuple[bytes | memoryview, ...] = b"",
        headers: dict[str, str] | None = None,
    ) -> tuple[bytes, dict[str, str]]:
        from cloud_gateway.remote.http1 import Malformed, TimedOut, Unreachable

        try:
            answer = await self._client.request(
                method, path, body=body, headers=headers, timeout=max(timeout, 0.001)
            )
        except TimedOut as exc:
            raise DeadlineExceeded(f"engine {self.name}: no answer within {timeout:.3f} s") from exc
        except Unreachable as exc:
            raise EngineUnreachable(f"engine {self.name} unreachable: {exc}") from exc
        except Malformed as exc:
            raise EngineError(f"engine {self.name}: {exc}") from exc
        if answer.status != 200:
            error = _HTTP_ERRORS.get(answer.status, EngineError)
            raise error(f"engine {self.name} answered {answer.status}: {_said(answer.body)}")
        return answer.body, answer.headers

    async def prepare(self) -> None:
        """Whether the engine takes binary tensors: its server metadata lists the
        ``binary_tensor_data`` extension (Triton, this gateway; not MLServer, which is
        sent JSON)."""
        body, _ = await self._send("GET", "/v2", self.settings.timeout_s)
        document = _json(body, self.name)
        extensions = document.get("extensions") if isinstance(document, dict) else None
        self.binary = isinstance(extensions, list) and "binary_tensor_data" in extensions

    async def ready(self) -> bool:
        try:
            await self._send("GET", "/v2/health/ready", self.settings.connect_timeout_s)
        except RequestError:
            return False
        return True

    async def index(self) -> list[dict[str, str]]:
        body, _ = await self._send(
            "POST",
            "/v2/repository/index",
            self.settings.timeout_s,
            b"{}",
            {"Content-Type": "application/json"},
        )
        entries = _json(body, self.name)
        if not isinstance(entries, list):
            raise EngineError(f"engine {self.name}: the repository index is not a list")
        return [
            {
                "name": str(e.get("name", "")),
                "version": str(e.get("version") or ""),
                "state": str(e.get("state", "")),
            }
            for e in entries
            if isinstance(e, dict)
        ]

    async def metadata(self, name: str, version: str) -> dict[str, Any]:
        path = f"/v2/models/{quote(name, safe='')}"
        if version:
            path += f"/versions/{quote(version, safe='')}"
        body, _ = await self._send("GET", path, self.settings.timeout_s)
        document = _json(body, self.name)
        if not isinstance(document, dict):
            raise EngineError(f"engine {self.name}: the metadata of {name} is not an object")
        return document

    async def infer(self, request: InferRequest, timeout: float) -> InferResponse:
        from edge_core.protocol.rest import (
            HEADER_LENGTH,
            decode_infer_response,
            encode_infer_request,
            forward_infer_request,
        )

        # the deadline travels as the protocol's timeout parameter (microseconds)
        us = max(int(timeout * 1e6), 1)
        parameters = {**request.parameters, "timeout": us}
        body: bytes | tuple[bytes | memoryview, ...]
        header_length: int | None
        if request.raw is not None and self.binary:
            # a device's binary request: its tensor bytes go on as they came
            body, header_length = forward_infer_request(request, parameters)
        else:
            outputs = request.outputs
            if self.binary and outputs is not None:  # binary answers: less to read here
                outputs = [RequestedOutput(o.name, True) for o in outputs]
            request = replace(request, parameters=parameters, outputs=outputs)
            body, header_length = encode_infer_request(request, binary=self.binary)
        headers = {"Content-Type": "application/json"}
        if header_length is not None:
            headers = {
                "Content-Type": "application/octet-stream",
                HEADER_LENGTH: str(header_length),
            }
        path = f"/v2/models/{quote(request.model_name, safe='')}"
        if request.model_version:
            path += f"/versions/{quote(request.model_version, safe='')}"
        content, answer = await self._send("POST", path + "/infer", timeout, body, headers)
        length = answer.get(HEADER_LENGTH.lower())
        try:
            # kept whole when its outputs are binary: the data plane may relay it
            return decode_infer_response(content, int(length) if length else None, keep_raw=True)
        except (ProtocolError, ValueError) as exc:
            raise EngineError(f"engine {self.name}: a malformed answer: {exc}") from exc

    async def close(self) -> None:
        await self._client.close()


def _json(body: bytes, engine: str) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:
        raise EngineError(f"engine {engine}: an answer that is not JSON") from exc


def _said(body: bytes) -> str:
    """What the engine said went wrong (Triton, MLServer and this gateway: ``error``)."""
    try:
        document = json.loads(body)
        said = document.get("error") or document.get("detail") or document
    except (ValueError, AttributeError):
        said = body.decode("utf-8", "replace")
    return str(said)[:300]


def make_engine(settings: BackendSettings, token: str | None) -> Engine:
    return (GrpcEngine if settings.protocol == "grpc" else HttpEngine)(settings, token)
