"""The Open Inference Protocol (KServe v2), shared by the agent and the gateway.

:mod:`.types` holds the protocol-neutral request and response; :mod:`.rest`
and :mod:`.grpc` translate them to and from the two wire formats.
"""

from edge_core.protocol.types import InferRequest, InferResponse, RequestedOutput

__all__ = ["InferRequest", "InferResponse", "RequestedOutput"]
