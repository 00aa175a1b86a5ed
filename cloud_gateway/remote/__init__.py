"""Remote backends: models run by an existing Open Inference Protocol engine
(Triton, KServe, MLServer, another gateway), forwarded on the event loop."""

from cloud_gateway.remote.backend import RemoteBackend
from cloud_gateway.remote.engine import Engine, GrpcEngine, HttpEngine, make_engine

__all__ = ["Engine", "GrpcEngine", "HttpEngine", "RemoteBackend", "make_engine"]
