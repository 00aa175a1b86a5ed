"""Offload over gRPC: the gateway's ``inference.GRPCInferenceService/ModelInfer``.

One channel per transport, reused by every request (HTTP/2 multiplexes them);
the device token and a request id travel as metadata, the deadline as the
gRPC deadline. gRPC's exceptions are translated here.
"""

from __future__ import annotations

from typing import Any

from edge_agent.offload.base import Transport
from edge_core.errors import OffloadRejected, OffloadTimeout, OffloadUnavailable, ProtocolError
from edge_core.protocol.grpc import pb, request_to_proto, response_from_proto
from edge_core.protocol.types import InferRequest, InferResponse
from edge_core.tls import TLSSettings, grpc_credentials

__all__ = ["GrpcTransport"]

METHOD = "/inference.GRPCInferenceService/ModelInfer"


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
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=pb().ModelInferResponse.FromString,
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
        try:
            message = self._call(
                request_to_proto(request), timeout=max(timeout, 0.001), metadata=metadata
            )
        except grpc.RpcError as exc:
            code = exc.code()
            details = exc.details() or code.name
            if code == grpc.StatusCode.UNAVAILABLE:
                raise OffloadUnavailable(f"gateway {self.address} unavailable: {details}") from exc
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise OffloadTimeout(
                    f"no answer from {self.address} within {timeout:.3f} s"
                ) from exc
            raise OffloadRejected(f"the gateway refused: {details}", status=code.name) from exc
        try:
            return response_from_proto(message)
        except ProtocolError as exc:
            raise OffloadRejected(f"malformed response from {self.address}: {exc}") from exc

    def close(self) -> None:
        self._channel.close()
