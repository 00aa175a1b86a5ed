"""The broker's access control through Mosquitto's dynamic security plugin: a device
that subscribes to another's topics is refused at once (SUBACK 0x87), and the fleet's
own traffic (offload through the gateways' shared subscription, telemetry,
announcements) still flows. A real Mosquitto and a real gateway."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator

import pytest

from cloud_gateway import GatewayConfig
from cloud_gateway.auth import DeviceRegistry
from cloud_gateway.config import MqttBridgeConfig
from cloud_gateway.mqtt.broker import (
    ensure_gateway_password,
    shared_requests,
    write_broker_files,
)
from edge_agent.bench.mosquitto import Mosquitto
from edge_agent.offload.mqtt import MqttTransport

from .test_mqtt import (
    GATEWAY_USER,
    Client,
    Fleet,
    digits,
    light_repository,
    light_request,
    wait_for,
)

NOT_AUTHORIZED = 0x87


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("secured")
    state = root / "state"
    registry = DeviceRegistry(state / "devices.json")
    tokens = {"cam-01": registry.add("cam-01", "g1"), "cam-02": registry.add("cam-02", "g2")}
    revoked = registry.add("cam-03", "g1")
    registry.revoke("cam-03")
    tokens["cam-03"] = revoked
    password = ensure_gateway_password(state / "mqtt-gateway.password")
    files = write_broker_files(registry, root, gateway_user=GATEWAY_USER, gateway_password=password)
    assert stat.S_IMODE(files.dynamic_security.stat().st_mode) == 0o600
    broker = Mosquitto(root / "broker", dynamic_security=files.dynamic_security)
    broker.start()
    config = GatewayConfig(
        repository=light_repository(root), state_dir=state, http_port=0, grpc_port=0,
        poll_interval_s=0.0, mqtt=MqttBridgeConfig(port=broker.port),
    )  # fmt: skip
    fleet = Fleet(root, registry, broker, tokens, password, config)
    fleet.start_gateway()
    yield fleet
    for gateway in fleet.gateways:
        gateway.stop()
    broker.stop()


def test_foreign_subscriptions_are_refused_when_they_are_made(secured: Fleet) -> None:
    intruder = secured.client("cam-01")
    try:
        for topic in (
            "devices/cam-02/telemetry/#",
            "devices/cam-02/responses",
            "devices/+/responses",
            "fleet/g2/models",
            "#",
            "$share/gateways/offload/+/infer",  # the gateways' share of the requests
            shared_requests(secured.gateway_password),  # even with the group's real name
        ):
            reason = intruder.subscribe(topic)
            assert reason.value == NOT_AUTHORIZED, (topic, reason)
        for topic in ("devices/cam-01/responses", "fleet/g1/models"):  # its own
            assert not intruder.subscribe(topic).is_failure, topic
        for topic in ("devices/cam-02/telemetry/status", "devices/cam-02/responses"):
            assert intruder.publish(topic, b"forged").value == NOT_AUTHORIZED, topic
        assert not intruder.publish("devices/cam-01/telemetry/status", b"{}").is_failure
    finally:
        intruder.close()


def test_the_fleets_traffic_flows(secured: Fleet) -> None:
    cloud = secured.client(GATEWAY_USER)
    connection = secured.connection("cam-01")
    transport = MqttTransport(connection, token=secured.tokens["cam-01"])
    connection.start()
    try:
        assert not cloud.subscribe("devices/+/telemetry/#").is_failure
        assert connection.wait_connected(10)
        answer = transport.infer(light_request(digits(2)), timeout=10)
        assert answer.outputs["probabilities"].shape == (2, 10)
        connection.publish("devices/cam-01/telemetry/status", json.dumps({"ok": 1}).encode())
        wait_for(lambda: cloud.received("devices/cam-01/telemetry/#"), what="the telemetry")
    finally:
        connection.close()
        cloud.close()


def test_wrong_passwords_and_revoked_devices_are_refused(secured: Fleet) -> None:
    for user, password in (("cam-01", "cam-01.wrong"), ("cam-03", secured.tokens["cam-03"])):
        client = Client(secured.broker.port, user, password)
        assert client.connack.is_failure, user
        client.close()
