"""TLS on both front ends, and client certificates required on gRPC."""

from __future__ import annotations

import http.client
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException

from cloud_gateway.config import ServerTLSSettings
from tests.support.gateway import start_gateway
from tests.support.gateway_calls import small_repository
from tests.support.tls import make_cert


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
