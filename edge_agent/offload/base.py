"""The transport interface of offloading: one request out, one response back.

A transport is a small seam (``infer(request, timeout=, request_id=)``) in the
manner of httpx's transports: gRPC (:mod:`.grpc`), HTTP (:mod:`.http`) and MQTT
(:mod:`.mqtt`) implement it. Transports are the client's internals: what leaves
the device goes through :class:`~edge_agent.offload.client.OffloadClient`,
whose exit guard checks every request; code that calls a transport itself
bypasses that check. A transport says how many bytes each exchange took on the
wire (:attr:`InferResponse.wire_bytes`), answers the gateway's metadata where its
protocol can ask for it, and translates its library's errors into the agent's
offload errors: :class:`OffloadUnavailable` (retryable), :class:`OffloadTimeout`,
:class:`OffloadRejected` (:class:`ModelNotFoundError` for metadata of a model the
gateway lacks).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from edge_core.protocol.types import InferRequest, InferResponse

__all__ = ["Transport"]


class Transport(ABC):
    """Sends Open Inference Protocol requests to the gateway."""

    name: str = "transport"
    # whether its metadata questions go to the gateway (MQTT answers from what it learnt)
    asks_the_gateway: bool = True

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

    def model_metadata(self, name: str, *, timeout: float) -> dict[str, Any] | None:
        """The gateway's metadata of model ``name`` (the protocol's: its inputs and
        outputs); ``None`` when this transport cannot ask (MQTT carries requests only).

        Raises:
            ModelNotFoundError: the gateway does not have the model.
            OffloadError: the gateway could not be asked.
        """
        return None

    def server_metadata(self, *, timeout: float) -> dict[str, Any] | None:
        """The gateway's server metadata (its ``extensions``); ``None`` as above.

        Raises:
            OffloadError: the gateway could not be asked.
        """
        return None

    def repository_index(self, *, timeout: float) -> list[dict[str, Any]] | None:
        """The gateway's repository index (each model's name, version and state);
        ``None`` as above.

        Raises:
            OffloadError: the gateway could not be asked.
        """
        return None

    def learnt_extensions(self) -> frozenset[str] | None:
        """The gateway's extensions as its answers named them (``None``: they do not:
        a transport that asks for them, :meth:`server_metadata`)."""
        return None

    def close(self) -> None:  # noqa: B027 - optional: transports without connections need nothing
        """Close the connections the transport keeps open."""
