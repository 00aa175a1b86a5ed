"""cloud_gateway: the cloud side of offload.

The Open Inference Protocol over REST and gRPC in front of one data plane,
with dynamic batching, device authentication, rate limits and metrics. It
imports the shared formats (tensors, model packages, the wire protocol) from
``edge_agent``; ``edge_agent`` never imports it.
"""

from cloud_gateway.config import GatewayConfig, load_config
from cloud_gateway.server import Gateway, GatewayThread

__all__ = ["Gateway", "GatewayConfig", "GatewayThread", "load_config"]
