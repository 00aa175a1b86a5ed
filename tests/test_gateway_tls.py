"""TLS on both front ends, and client certificates required on gRPC."""

from __future__ import annotations

import datetime
import http.client
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tritonclient.utils import InferenceServerException

from cloud_gateway.config import ServerTLSSettings

from .support.gateway import start_gateway
from .test_gateway import small_repository


def make_cert(
    folder: Path,
    name: str,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    server: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer[0].subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
    cert = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
    (folder / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / f"{name}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert, key


def test_tls_with_client_certificates(tmp_path: Path) -> None:
    ca = make_cert(tmp_path, "ca", None)
    make_cert(tmp_path, "server", ca, server=True)
    make_cert(tmp_path, "client", ca)
    tls = ServerTLSSettings(
        cert=tmp_path / "server.pem",
        key=tmp_path / "server.key",
        client_ca=tmp_path / "ca.pem",
        require_client_cert=True,
    )
    handle = start_gateway(tmp_path, small_repository(tmp_path), tls=tls, poll_interval_s=0.0)
    try:
        x = np.zeros((1, 64), np.float32)
        client = tgrpc.InferenceServerClient(
            f"localhost:{handle.gateway.grpc_port}",
            ssl=True,
            root_certificates=str(tmp_path / "ca.pem"),
            private_key=str(tmp_path / "client.key"),
            certificate_chain=str(tmp_path / "client.pem"),
        )
        tensor = tgrpc.InferInput("pixels", [1, 64], "FP32")
        tensor.set_data_from_numpy(x)
        assert client.infer("digits-light", [tensor], headers=handle.headers()).as_numpy(
            "probabilities"
        ).shape == (1, 10)
        # no client certificate: the handshake fails
        anonymous = tgrpc.InferenceServerClient(
            f"localhost:{handle.gateway.grpc_port}",
            ssl=True,
            root_certificates=str(tmp_path / "ca.pem"),
        )
        with pytest.raises(InferenceServerException) as info:
            anonymous.is_server_live(client_timeout=5)
        assert info.value.status() == "StatusCode.UNAVAILABLE"  # the handshake was refused
        # HTTPS with the same certificates
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        context.load_cert_chain(str(tmp_path / "client.pem"), str(tmp_path / "client.key"))
        url = f"https://localhost:{handle.gateway.http_port}/v2/health/live"
        with urllib.request.urlopen(url, context=context, timeout=10) as response:
            assert response.status == 200
        # HTTPS without a client certificate is refused as well
        bare = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
            urllib.request.urlopen(url, context=bare, timeout=10)
        # plain HTTP on the TLS port does not get through
        with pytest.raises((ConnectionError, http.client.HTTPException, urllib.error.URLError)):
            urllib.request.urlopen(
                f"http://localhost:{handle.gateway.http_port}/v2/health/live", timeout=5
            )
    finally:
        handle.thread.stop()
