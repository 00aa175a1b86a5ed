"""Offloading requests to the cloud gateway.

:class:`Transport` is the seam (gRPC first, HTTP second; :class:`FailoverTransport`
over several gateway replicas);
:class:`OffloadClient` adds the deadline, retries and the circuit breaker;
:class:`ExitGuard` enforces the privacy rules where bytes leave.
"""

from edge_agent.offload.base import Transport
from edge_agent.offload.breaker import CircuitBreaker
from edge_agent.offload.client import OffloadClient
from edge_agent.offload.failover import FailoverTransport
from edge_agent.offload.guard import ExitGuard
from edge_core.tls import TLSSettings

__all__ = [
    "CircuitBreaker",
    "ExitGuard",
    "FailoverTransport",
    "OffloadClient",
    "Transport",
    "make_transport",
    "make_transports",
]


def make_transport(
    protocol: str, address: str, *, token: str | None = None, tls: TLSSettings | None = None
) -> Transport:
    """A transport for ``protocol`` (``grpc`` or ``http``); its library is imported here."""
    if protocol == "grpc":
        from edge_agent.offload.grpc import GrpcTransport

        return GrpcTransport(address, token=token, tls=tls)
    if protocol == "http":
        from edge_agent.offload.http import HttpTransport

        return HttpTransport(address, token=token, tls=tls)
    raise ValueError(f"unknown offload protocol {protocol!r}; expected grpc or http")


def make_transports(
    protocol: str,
    addresses: tuple[str, ...],
    *,
    token: str | None = None,
    tls: TLSSettings | None = None,
) -> Transport:
    """One transport for one address; for several replicas, a :class:`FailoverTransport`
    over one transport each (round robin, failover within the deadline)."""
    transports = [make_transport(protocol, a, token=token, tls=tls) for a in addresses]
    return transports[0] if len(transports) == 1 else FailoverTransport(transports)
