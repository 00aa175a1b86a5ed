"""The gateway's /metrics names devices and groups only to operators (issue 29, item 6).

Before, any device token read every series, ``gateway_device_requests_total{device=
"camB",group="gB"}`` among them: one device could list the fleet. Now a device token
is refused (403); a metrics token (a Prometheus's bearer token file), which may do
nothing else, and an admin token read everything; and ``[metrics] public = true``
shows everyone else only the series that name neither a device nor a group. A real
gateway on loopback, with its REST and gRPC front ends, and a real Mosquitto.
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from cloud_gateway.auth import DeviceRegistry
from cloud_gateway.metrics import GatewayMetrics
from edge_agent.offload.mqtt import MqttTransport
from edge_core.errors import OffloadRejected
from edge_core.protocol.mqtt import encode_request
from edge_core.protocol.types import InferRequest
from tests.support.gateway import GatewayHandle, start_gateway
from tests.support.mqtt_fleet import Fleet, digits, light_request, running_fleet, sample
from tests.support.paths import MODELS
from tests.support.waiting import wait_for

FLEET_LABEL = re.compile(r'[{,](device|group)="')


def get(handle: GatewayHandle, path: str, token: str | None = None) -> tuple[int, str]:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://{handle.http_url}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def infer(handle: GatewayHandle, token: str) -> int:
    """The status of one REST inference with ``token``."""
    body = {
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}]
    }
    request = urllib.request.Request(
        f"http://{handle.http_url}/v2/models/digits-light/infer",
        data=json.dumps(body).encode(),
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


@pytest.fixture(scope="module", params=[False, True], ids=["private", "public"])
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayHandle, str, str]]:
    """A gateway, camB's token (it has made one request) and a metrics token."""
    root = tmp_path_factory.mktemp("metrics")
    repository = root / "repo"
    shutil.copytree(MODELS / "digits-light", repository / "digits-light")
    handle = start_gateway(root, repository, poll_interval_s=0.0, metrics_public=request.param)
    try:
        url = handle.gateway.config.state_url
        camb = DeviceRegistry.add_to(url, "camB", "gB")
        scraper = DeviceRegistry.add_to(url, "prometheus", "operators", role="metrics")
        assert infer(handle, camb) == 200
        yield handle, camb, scraper
    finally:
        handle.thread.stop()


def test_operators_read_every_series(gateway: tuple[GatewayHandle, str, str]) -> None:
    handle, _, scraper = gateway
    for token in (scraper, handle.admin_token):
        status, text = get(handle, "/metrics", token)
        assert status == 200
        assert 'gateway_device_requests_total{device="camB",group="gB"} 1.0' in text
        assert "gateway_requests_total" in text and "gateway_model_loaded" in text


def test_a_metrics_token_reads_metrics_and_nothing_else(
    gateway: tuple[GatewayHandle, str, str],
) -> None:
    import tritonclient.grpc as tgrpc
    from tritonclient.utils import InferenceServerException

    handle, _, scraper = gateway
    assert infer(handle, scraper) == 403
    for path in ("/v2", "/v2/models/digits-light", "/v2/models/digits-light/ready"):
        status, text = get(handle, path, scraper)
        assert status == 403 and "metrics token" in text, (path, text)
    client = tgrpc.InferenceServerClient(handle.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="PERMISSION_DENIED"):
            client.is_model_ready("digits-light", headers={"authorization": f"Bearer {scraper}"})
    finally:
        client.close()


def test_a_device_never_sees_another_device_or_group(
    gateway: tuple[GatewayHandle, str, str],
) -> None:
    handle, camb, _ = gateway
    public = handle.gateway.config.metrics_public
    for token in (handle.device_token, camb):  # cam-01's, and camB's own
        status, text = get(handle, "/metrics", token)
        if not public:
            assert status == 403, text
            assert "admin token" in json.loads(text)["error"]
            continue
        assert status == 200  # what anyone may read, and no more
        assert not FLEET_LABEL.search(text), text
        assert "camB" not in text and "gB" not in text and "rpi5-int8" not in text
        assert 'gateway_requests_total{model="digits-light",protocol="http",status="ok"}' in text
    status, text = get(handle, "/metrics")  # no token
    if public:
        assert status == 200 and "gateway_state_queries" in text and not FLEET_LABEL.search(text)
    else:
        assert status == 401
    assert get(handle, "/metrics", "camB.not-its-token")[0] == 401  # a token given is checked


def test_only_series_without_fleet_labels_are_public() -> None:
    """Whatever a series counts, a label naming a device or a group keeps it for operators."""
    metrics = GatewayMetrics()
    metrics.device_requests.labels("camB", "gB").inc()
    metrics.mqtt_announcements.labels("gB").inc()
    metrics.requests.labels("digits-light", "mqtt", "ok").inc()
    everything = metrics.render(operator=True).decode()
    public = metrics.render(operator=False).decode()
    assert 'device="camB"' in everything and 'group="gB"' in everything
    assert not FLEET_LABEL.search(public) and "camB" not in public and "gB" not in public
    assert 'gateway_requests_total{model="digits-light",protocol="mqtt",status="ok"}' in public
    kept = {line for line in everything.splitlines() if not FLEET_LABEL.search(line)}
    left_out = {line.split()[2] for line in kept - set(public.splitlines())}
    assert left_out == {
        f"gateway_{name}_{kind}"
        for name in ("device_requests", "mqtt_announcements")
        for kind in ("total", "created")
    }
    assert set(public.splitlines()) <= kept  # only the two families' HELP and TYPE went


def series(metrics: GatewayMetrics) -> set[str]:
    """Every series of a gateway, by name and labels (values left out)."""
    text = metrics.render(operator=True).decode()
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("fleet")) as running:
        yield running


@pytest.mark.broker
def test_names_a_device_sends_over_mqtt_make_no_series(fleet: Fleet) -> None:
    """The label sets a device can reach stay bounded over MQTT too (REST and gRPC:
    tests/gateway/test_abuse_gateway.py): invented models and versions count as ``unknown``."""
    metrics = fleet.gateways[0].gateway.metrics
    connection = fleet.connection("cam-01")
    transport = MqttTransport(connection, token=fleet.tokens["cam-01"])
    connection.start()
    try:
        assert connection.wait_connected(10)
        x = digits(1)

        def abuse(start: int, rounds: int) -> None:
            for i in range(start, start + rounds):
                for name, version in ((f"nope-{i:05d}", ""), ("digits-light", str(i + 2))):
                    request = InferRequest(
                        inputs={"pixels": x}, datatypes={"pixels": "FP32"},
                        model_name=name, model_version=version,
                    )  # fmt: skip
                    with pytest.raises(OffloadRejected, match=r"404|unknown|version"):
                        transport.infer(request, timeout=10)
                transport.infer(light_request(x), timeout=10)

        abuse(0, 3)  # every kind of series the loop makes exists now
        before = series(metrics)
        abuse(100, 100)
        after = series(metrics)
    finally:
        connection.close()
    assert after == before, sorted(after ^ before)
    assert not any("nope-" in line for line in after)


@pytest.mark.broker
def test_a_metrics_token_neither_signs_in_to_the_broker_nor_offloads(fleet: Fleet) -> None:
    token = fleet.registry.add("prometheus", "operators", role="metrics")
    fleet.write_acl()
    users = (fleet.root / "passwd").read_text() + (fleet.root / "acl").read_text()
    assert "prometheus" not in users + (fleet.root / "dynamic-security.json").read_text()
    gateway = fleet.gateways[0]

    def dropped() -> float:
        return sample(gateway, "gateway_mqtt_dropped_total", reason="unauthenticated")

    before = dropped()
    sender = fleet.client("cam-02")  # any device may publish requests; the token decides
    try:
        wait_for(lambda: gateway.gateway.registry.get("prometheus") is not None, what="the add")
        body = encode_request(light_request(digits(1)), token=token)
        sender.publish(
            "offload/digits-light/infer", body.payload, response_topic="devices/prometheus/responses",
            correlation=b"c1", user=body.properties,
        )  # fmt: skip
        wait_for(lambda: dropped() == before + 1, what="the request to be dropped")
    finally:
        sender.close()
