"""The broker's access control through Mosquitto's dynamic security plugin: a device
that subscribes to another's topics is refused at once (SUBACK 0x87), and the fleet's
own traffic (offload through the gateways' shared subscription, telemetry,
announcements) still flows. A real Mosquitto and a real gateway."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator

import pytest

from cloud_gateway.mqtt.broker import (
    shared_requests,
)
from edge_agent.offload.mqtt import MqttTransport
from tests.support.mqtt_fleet import (
    GATEWAY_USER,
    Client,
    Fleet,
    digits,
    light_request,
    running_fleet,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.broker

NOT_AUTHORIZED = 0x87


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("secured")
    with running_fleet(root, dynamic_security=True, revoked=("cam-03",)) as fleet:
        assert stat.S_IMODE((root / "dynamic-security.json").stat().st_mode) == 0o600
        yield fleet


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
        for topic in (
            "devices/cam-02/telemetry/status",
            "devices/cam-02/responses",
            "devices/cam-02/streams/door/results",
        ):
            assert intruder.publish(topic, b"forged").value == NOT_AUTHORIZED, topic
        for topic in ("devices/cam-01/telemetry/status", "devices/cam-01/streams/door/results"):
            assert not intruder.publish(topic, b"{}").is_failure, topic
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
