"""The transport interface of offloading: one request out, one response back.

A transport is a small seam (``infer(request, timeout=, request_id=)``) in the
manner of httpx's transports: gRPC (:mod:`.grpc`) and HTTP (:mod:`.http`)
implement it, MQTT later. Transports are the client's internals: what leaves
the device goes through :class:`~edge_agent.offload.client.OffloadClient`,
whose exit guard checks every request; code that calls a transport itself
bypasses that check. A transport
translates its library's errors into the agent's offload errors:
:class:`OffloadUnavailable` (retryable), :class:`OffloadTimeout`,
:class:`OffloadRejected`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from edge_core.protocol.types import InferRequest, InferResponse

__all__ = ["Transport"]


class Transport(ABC):
    """Sends Open Inference Protocol requests to the gateway."""

    name: str = "transport"

    @abstractmethod
    def infer(
        self, request: InferRequest, *, timeout: float, request_id: str = ""
    ) -> InferResponse:
        """Send one request; wait at most ``timeout`` seconds for its response.

        Raises:
            OffloadUnavailable: the gateway cannot be reached (worth a retry).
            OffloadTimeout: no response in time.
            OffloadRejected: the gateway answered with an error.
        """

    def close(self) -> None:  # noqa: B027 - optional: transports without connections need nothing
        """Close the connections the transport keeps open."""
