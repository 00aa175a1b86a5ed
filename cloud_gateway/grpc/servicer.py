"""The gRPC front end: ``inference.GRPCInferenceService`` on ``grpc.aio``.

A thin translation between protobuf and the data plane. The caller's token
comes in the ``authorization`` metadata (``Bearer <token>``); errors become
gRPC statuses from the one table in :mod:`edge_core.status`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from cloud_gateway.access import Access
from cloud_gateway.auth import Device, parse_bearer
from cloud_gateway.dataplane import DataPlane
from edge_core.protocol.grpc import (
    Malformed,
    generic_handler,
    request_from_proto,
    response_to_proto,
)
from edge_core.status import status_of

__all__ = ["InferenceServicer", "add_to_server"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, plane: DataPlane, access: Access) -> None:
        self.plane = plane
        self.access = access

    async def _guard(self, context: Any, call: Callable[[], Awaitable[T]]) -> T | None:
        try:
            return await call()
        except Exception as exc:
            _fail(context, exc)
            return None

    def _device(self, context: Any, *, admin: bool = False) -> Device:
        token = None
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                token = parse_bearer(value)
        return self.access.authenticate(token, admin=admin)

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=self.plane.live())

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.plane.ready())

    async def ModelReady(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            self._device(context)
            return pb.ModelReadyResponse(
                ready=self.plane.model_ready(request.name, request.version)
            )

        return await self._guard(context, call)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            self._device(context)
            return pb.ServerMetadataResponse(**self.plane.server_metadata())

        return await self._guard(context, call)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            self._device(context)
            meta = self.plane.model_metadata(request.name, request.version)
            return pb.ModelMetadataResponse(
                name=meta["name"],
                versions=meta["versions"],
                platform=meta["platform"],
                inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["inputs"]],
                outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["outputs"]],
            )

        return await self._guard(context, call)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        # the hot path: guarded in place, not through _guard's closure and extra coroutine
        try:
            token = request_id = None
            for key, value in context.invocation_metadata() or ():  # one pass, both keys
                if key == "authorization":
                    token = parse_bearer(value)
                elif key == "x-request-id":
                    request_id = str(value)
            try:
                device = self.access.authenticate(token)
                infer_request = request_from_proto(request)
            except Exception as exc:
                self.plane.count_failure(request.model_name, "grpc", exc)
                raise
            remaining = context.time_remaining()
            deadline = None if remaining is None else self.plane.clock() + remaining
            response = await self.plane.infer(
                infer_request,
                device=device,
                protocol="grpc",
                deadline=deadline,
                request_id=request_id,
            )
            return response_to_proto(response)
        except Exception as exc:
            _fail(context, exc)
            return None

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            device = self._device(context)
            return pb.RepositoryIndexResponse(
                models=[
                    pb.RepositoryIndexResponse.ModelIndex(
                        name=m["name"],
                        version=m["version"],
                        state=m["state"],
                        reason=m.get("reason", ""),
                    )
                    for m in self.plane.repository_index(admin=device.role == "admin")
                ]
            )

        return await self._guard(context, call)

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            self._device(context, admin=True)
            await self.plane.load(request.model_name)
            return pb.RepositoryModelLoadResponse()

        return await self._guard(context, call)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            self._device(context, admin=True)
            await self.plane.unload(request.model_name)
            return pb.RepositoryModelUnloadResponse()

        return await self._guard(context, call)


def _fail(context: Any, exc: Exception) -> None:
    """Set ``exc``'s status as the call's; the handler returns ``None`` after it.

    Not ``context.abort``: its exception would carry ``exc``, whose traceback holds the
    frames that hold the request, in a cycle through gRPC's own frames: every failed
    request's message would stay in memory until the garbage collector's next full
    pass."""
    status = status_of(exc)
    if status.kind == "internal":
        log.error("gRPC call failed: %s", exc)
    context.set_code(grpc.StatusCode[status.grpc])
    context.set_details(status.message)


def _checked(method: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
    async def handler(request: Any, context: Any) -> Any:
        if isinstance(request, Malformed):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"malformed protobuf request: {request.error}"
            )
        return await method(request, context)

    return handler


IMPLEMENTED = (
    "ServerLive",
    "ServerReady",
    "ModelReady",
    "ServerMetadata",
    "ModelMetadata",
    "ModelInfer",
    "RepositoryIndex",
    "RepositoryModelLoad",
    "RepositoryModelUnload",
)


def add_to_server(servicer: InferenceServicer, server: Any) -> None:
    """Register the service's methods on ``server``; a request that is not valid
    protobuf is answered INVALID_ARGUMENT. Methods not implemented here (streaming,
    shared memory, tracing) are answered UNIMPLEMENTED by gRPC itself."""
    methods = {name: _checked(getattr(servicer, name)) for name in IMPLEMENTED}
    server.add_generic_rpc_handlers((generic_handler(methods),))
