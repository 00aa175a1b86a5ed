"""Offload over gRPC: the gateway's ``inference.GRPCInferenceService/ModelInfer``.

One channel per transport, reused by every request (HTTP/2 multiplexes them);
the device token and a request id travel as metadata, the deadline as the
gRPC deadline. gRPC's exceptions are translated here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edge_agent.offload.base import Transport
from edge_core.errors import (
    ModelNotFoundError,
    OffloadRejected,
    OffloadTimeout,
    OffloadUnavailable,
)
from edge_core.protocol.grpc import pb, request_to_proto, response_from_proto
from edge_core.protocol.types import InferRequest, InferResponse
from edge_core.tls import TLSSettings, grpc_credentials

__all__ = ["GrpcTransport"]

SERVICE = "/inference.GRPCInferenceService/"
METHOD = SERVICE + "ModelInfer"


class GrpcTransport(Transport):
    name = "grpc"

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        tls: TLSSettings | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        import grpc

        self._grpc = grpc
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.keepalive_time_ms", 30_000),
            # reconnect quickly once the gateway is back (defaults back off to minutes)
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2_000),
        ]
        if tls is None:
            self._channel = grpc.insecure_channel(address, options=options)
        else:
            credentials = grpc_credentials(tls, options)
            self._channel = grpc.secure_channel(address, credentials, options=options)
        self._call = self._channel.unary_unary(
            METHOD,
            request_serializer=lambda data: data,  # serialized here, to count its bytes
            response_deserializer=lambda data: data,
        )
        self._model_metadata = self._channel.unary_unary(
            SERVICE + "ModelMetadata",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=pb().ModelMetadataResponse.FromString,
        )
        self._repository_index = self._channel.unary_unary(
            SERVICE + "RepositoryIndex",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=pb().RepositoryIndexResponse.FromString,
        )
        self._server_metadata = self._channel.unary_unary(
            SERVICE + "ServerMetadata",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=pb().ServerMetadataResponse.FromString,
        )
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        self.address = address

    def infer(
        self, request: InferRequest, *, timeout: float, request_id: str = ""
    ) -> InferResponse:
        grpc = self._grpc
        metadata = list(self._metadata)
        if request_id:
            metadata.append(("x-request-id", request_id))
        body = request_to_proto(request).SerializeToString()
        try:
            data = self._call(body, timeout=max(timeout, 0.001), metadata=metadata)
        except grpc.RpcError as exc:
            raise self._error(exc, timeout) from exc
        try:
            response = response_from_proto(pb().ModelInferResponse.FromString(data))
        except Exception as exc:  # DecodeError, ProtocolError
            raise OffloadRejected(f"malformed response from {self.address}: {exc}") from exc
        return replace(response, wire_bytes=(len(body), len(data)))

    def _error(self, exc: Any, timeout: float) -> Exception:
        """gRPC's error as the agent's offload error."""
        grpc = self._grpc
        code = exc.code()
        details = exc.details() or code.name
        if code == grpc.StatusCode.UNAVAILABLE:
            return OffloadUnavailable(f"gateway {self.address} unavailable: {details}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return OffloadTimeout(f"no answer from {self.address} within {timeout:.3f} s")
        return OffloadRejected(f"the gateway refused: {details}", status=code.name)

    def model_metadata(self, name: str, *, timeout: float) -> dict[str, Any] | None:
        try:
            message = self._model_metadata(
                pb().ModelMetadataRequest(name=name),
                timeout=max(timeout, 0.001),
                metadata=self._metadata,
            )
        except self._grpc.RpcError as exc:
            if exc.code() == self._grpc.StatusCode.NOT_FOUND:
                raise ModelNotFoundError(exc.details() or f"no model {name!r}") from exc
            raise self._error(exc, timeout) from exc
        return {
            "name": message.name,
            "inputs": [_tensor(t) for t in message.inputs],
            "outputs": [_tensor(t) for t in message.outputs],
        }

    def server_metadata(self, *, timeout: float) -> dict[str, Any] | None:
        try:
            message = self._server_metadata(
                pb().ServerMetadataRequest(), timeout=max(timeout, 0.001), metadata=self._metadata
            )
        except self._grpc.RpcError as exc:
            raise self._error(exc, timeout) from exc
        return {"name": message.name, "extensions": list(message.extensions)}

    def repository_index(self, *, timeout: float) -> list[dict[str, Any]] | None:
        try:
            message = self._repository_index(
                pb().RepositoryIndexRequest(ready=True),
                timeout=max(timeout, 0.001),
                metadata=self._metadata,
            )
        except self._grpc.RpcError as exc:
            raise self._error(exc, timeout) from exc
        return [{"name": m.name, "version": m.version, "state": m.state} for m in message.models]

    def close(self) -> None:
        self._channel.close()


def _tensor(message: Any) -> dict[str, Any]:
    return {"name": message.name, "datatype": message.datatype, "shape": list(message.shape)}
