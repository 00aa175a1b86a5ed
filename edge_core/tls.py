"""TLS settings, on both sides: the CA a client trusts and its own certificate.

The agent uses them for the gateway and the broker, the gateway for the broker;
every configuration reads its ``tls`` tables with :func:`read_tls`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_core.fields import Fields

__all__ = ["TLSSettings", "client_context", "grpc_credentials", "read_tls"]


@dataclass(frozen=True)
class TLSSettings:
    """TLS to a server: the CA to trust, and a client certificate when it asks for one.

    Attributes:
        ca (default: the system's CAs): the CA certificate (PEM) the server's
            certificate must chain to.
        cert: this client's certificate (PEM), for a server that asks for one; with
            ``key``.
        key: the private key of ``cert`` (PEM).
        server_name (default: the host of the address): the name checked in the
            server's certificate.
    """

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None  # override the name checked in the server's certificate


def read_tls(fields: Fields, resolve: Callable[[str], Path]) -> TLSSettings | None:
    """The ``tls`` table of ``fields`` (``None`` when absent).

    Raises:
        ConfigError: a field is wrong, or ``cert`` comes without ``key``.
    """
    if not fields.has("tls"):
        return None
    t = fields.table("tls")

    def path(key: str) -> Path | None:
        value = t.string(key, None)
        return resolve(value) if value is not None else None

    tls = TLSSettings(
        ca=path("ca"),
        cert=path("cert"),
        key=path("key"),
        server_name=t.string("server_name", None),
    )
    if (tls.cert is None) != (tls.key is None):
        raise t.fail("cert", "cert and key go together")
    t.done()
    return tls


def client_context(tls: TLSSettings) -> Any:
    """An ``ssl.SSLContext`` for an HTTPS client (httpx's ``verify``): ``tls``'s CA, or
    the system's, and its client certificate when it has one."""
    import ssl

    context = ssl.create_default_context(cafile=str(tls.ca) if tls.ca else None)
    if tls.cert is not None:
        context.load_cert_chain(str(tls.cert), str(tls.key) if tls.key else None)
    return context


def grpc_credentials(tls: TLSSettings, options: list[tuple[str, Any]]) -> Any:
    """``grpc.ssl_channel_credentials`` for ``tls``; the name checked in the server's
    certificate, when overridden, is added to the channel's ``options``."""
    import grpc

    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca.read_bytes() if tls.ca else None,
        private_key=tls.key.read_bytes() if tls.key else None,
        certificate_chain=tls.cert.read_bytes() if tls.cert else None,
    )
