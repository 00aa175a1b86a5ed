"""The local API over gRPC: ``inference.GRPCInferenceService`` on ``127.0.0.1``,
so ``tritonclient.grpc`` calls the agent unchanged.

A synchronous ``grpc`` server with a small thread pool (the agent's work is
blocking: runtimes and offload calls), bounded per ``[api]``: ``grpc_workers``
calls run at once, at most ``max_grpc_calls`` run or wait (one more is
RESOURCE_EXHAUSTED at once); messages up to ``max_body_bytes``; a connection
idle for ``idle_timeout_s`` (at least 60 s: a gRPC client keeps its channel
between calls) is closed, as is any after an hour (with a grace period for
the calls on it). The label comes in the
``x-edge-label`` metadata (or the ``edge_label`` parameter), the request id in
``x-request-id``; errors are gRPC statuses from the one table in
:mod:`.frontend`. A refusal by the policy carries its decision in the trailing
metadata: ``edge-decision`` (the action), ``edge-reason`` and ``edge-model``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from edge_agent.config import ApiSettings
from edge_agent.service.frontend import LocalService
from edge_agent.service.http_api import SERVER
from edge_core.protocol.grpc import (
    Malformed,
    generic_handler,
    pb,
    request_from_proto,
    response_to_proto,
)
from edge_core.status import status_of

__all__ = ["GrpcApi"]

log = logging.getLogger(__name__)

MAX_DEADLINE_S = 365 * 86400.0  # a longer gRPC deadline is no deadline at all


def _metadata(context: Any, key: str) -> str | None:
    for name, value in context.invocation_metadata() or ():
        if name == key:
            return str(value)
    return None


class GrpcApi:
    def __init__(self, service: LocalService, settings: ApiSettings | None = None) -> None:
        settings = settings or ApiSettings()
        self.service = service
        idle_ms = int(max(settings.idle_timeout_s, 60.0) * 1000)
        self._server = grpc.server(
            ThreadPoolExecutor(settings.grpc_workers, thread_name_prefix="local-grpc"),
            options=[
                ("grpc.max_receive_message_length", settings.max_body_bytes),
                ("grpc.max_send_message_length", settings.max_body_bytes),
                ("grpc.so_reuseport", 0),
                ("grpc.max_connection_idle_ms", idle_ms),
                ("grpc.max_connection_age_ms", 3_600_000),
                ("grpc.max_connection_age_grace_ms", int(settings.drain_s * 1000) + 1000),
            ],
            maximum_concurrent_rpcs=settings.max_grpc_calls,
        )
        methods: dict[str, Callable[[Any, Any], Any]] = {
            "ServerLive": self._live,
            "ServerReady": self._ready,
            "ModelReady": self._model_ready,
            "ServerMetadata": self._server_metadata,
            "ModelMetadata": self._model_metadata,
            "ModelInfer": self._infer,
            "RepositoryIndex": self._repository_index,
        }
        self._server.add_generic_rpc_handlers(
            (generic_handler({name: _guarded(m) for name, m in methods.items()}),)
        )
        host = settings.host
        bracketed = f"[{host}]" if ":" in host else host
        self.port = self._server.add_insecure_port(f"{bracketed}:{settings.grpc_port}")
        self.address = f"{bracketed}:{self.port}"

    def start(self) -> None:
        self._server.start()
        log.info("local API (gRPC) on %s", self.address)

    def stop(self, grace: float) -> None:
        """Stop accepting; calls already running get ``grace`` seconds to finish
        (returns at once: the daemon waits for them itself)."""
        self._server.stop(grace)

    # -- methods ----------------------------------------------------------------------------

    def _live(self, request: Any, context: Any) -> Any:
        return pb().ServerLiveResponse(live=True)

    def _ready(self, request: Any, context: Any) -> Any:
        return pb().ServerReadyResponse(ready=self.service.ready)

    def _model_ready(self, request: Any, context: Any) -> Any:
        self.service.model_metadata(request.name, request.version)
        return pb().ModelReadyResponse(ready=self.service.ready)

    def _server_metadata(self, request: Any, context: Any) -> Any:
        return pb().ServerMetadataResponse(**SERVER)

    def _model_metadata(self, request: Any, context: Any) -> Any:
        meta = self.service.model_metadata(request.name, request.version)
        tensor = pb().ModelMetadataResponse.TensorMetadata
        return pb().ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=[tensor(**t) for t in meta["inputs"]],
            outputs=[tensor(**t) for t in meta["outputs"]],
        )

    def _repository_index(self, request: Any, context: Any) -> Any:
        index = pb().RepositoryIndexResponse
        return index(
            models=[
                index.ModelIndex(
                    name=m["name"],
                    version=m["version"],
                    state=m["state"],
                    reason=m.get("reason", ""),
                )
                for m in self.service.repository_index()
            ]
        )

    def _infer(self, request: Any, context: Any) -> Any:
        infer_request = request_from_proto(request)
        remaining = context.time_remaining()  # huge (not None) when the client set none
        if (
            remaining is not None
            and remaining < MAX_DEADLINE_S
            and "timeout" not in infer_request.parameters
        ):
            infer_request.parameters["timeout"] = max(1, int(remaining * 1e6))
        response = self.service.infer(
            infer_request,
            label=_metadata(context, "x-edge-label"),
            request_id=_metadata(context, "x-request-id"),
        )
        return response_to_proto(response)


def _guarded(method: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def handler(request: Any, context: Any) -> Any:
        if isinstance(request, Malformed):
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"malformed protobuf request: {request.error}"
            )
        try:
            return method(request, context)
        except Exception as exc:
            # the status set, not context.abort: its exception would hold this one and,
            # through its traceback, the request, in a cycle only a full collection frees
            status = status_of(exc)
            trailing = _decision_metadata(exc)
            if trailing:
                context.set_trailing_metadata(trailing)
            context.set_code(grpc.StatusCode[status.grpc])
            context.set_details(status.message)
            return None

    return handler


def _decision_metadata(exc: BaseException) -> tuple[tuple[str, str], ...]:
    """The policy's decision behind a refusal as trailing metadata (``edge-decision``,
    ``edge-reason``, ``edge-model``), as the HTTP API puts it in the error body;
    nothing for an error without a decision."""
    decision = getattr(exc, "decision", None)
    if decision is None:
        return ()
    document = decision.to_dict()
    pairs = (
        ("edge-decision", document.get("decision")),
        ("edge-reason", document.get("reason")),
        ("edge-model", document.get("model")),
    )
    return tuple((key, str(value)) for key, value in pairs if value is not None)
