"""cloud_gateway: the cloud side of offload.

The Open Inference Protocol over REST and gRPC in front of one data plane,
with dynamic batching, device authentication, rate limits and metrics. It
imports the shared formats (tensors, model packages, the wire protocol) from
``edge_core``; ``edge_agent`` and it never import each other.

The public API is what ``__all__`` lists. The names are loaded when first used
(PEP 562), as ``edge_agent``'s are: ``import cloud_gateway.batching`` (pure
arithmetic) or ``cloud_gateway.config`` loads neither gRPC, FastAPI nor SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_core.lazy import lazy_exports

# name -> the module that defines it
_EXPORTS = {
    "Gateway": "cloud_gateway.server",
    "GatewayThread": "cloud_gateway.server",
    "GatewayConfig": "cloud_gateway.config",
    "load_config": "cloud_gateway.config",
}

__all__ = ["Gateway", "GatewayConfig", "GatewayThread", "load_config"]

if TYPE_CHECKING:
    from cloud_gateway.config import GatewayConfig, load_config
    from cloud_gateway.server import Gateway, GatewayThread


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
