"""No device can take another client's MQTT client id (issue 29, item 4), with either
form of the broker's files that `cloud-gateway mqtt acl` writes, on a real Mosquitto
with two gateway replicas bridging it.

Mosquitto disconnects a client when another connects with the same client id, and
neither its ACL file nor its password file looks at the id: before, one device with
its own token could knock any other device (``agent-<id>``), or a gateway replica,
off the broker as often as it liked. Now the devices' listener makes each device's
client id its user name (password and ACL files), or the dynamic security plugin
refuses a device that asks for any id but its own; the replicas sign in on a
listener of their own (or, with the plugin, as a client with no fixed id) and keep
one id each.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from edge_agent.offload.mqtt import MqttTransport
from edge_core.protocol.mqtt import client_id
from tests.support.mqtt_fleet import Client, Fleet, digits, light_request, running_fleet, sample
from tests.support.waiting import wait_for

pytestmark = pytest.mark.broker


def takeovers(fleet: Fleet, client: str) -> int:
    """How often the broker disconnected ``client`` for a newcomer with its id."""
    log = fleet.broker.log.read_text(errors="replace")
    return log.count(f"Client {client} already connected, closing old connection")


@pytest.fixture(scope="module", params=["files", "dynamic-security"])
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp(request.param)
    with running_fleet(root, dynamic_security=request.param != "files") as running:
        running.start_gateway()  # a second replica, with the same user and password
        yield running


def replica_ids(fleet: Fleet) -> set[str]:
    """The client ids the gateway replicas connected with, as the broker logged them."""
    log = fleet.broker.log.read_text(errors="replace")
    return set(re.findall(r" as (\S+) \(p\d, c\d, k\d+, u'_gateway'\)", log))


def test_a_device_cannot_knock_another_client_off_with_its_id(fleet: Fleet) -> None:
    victim = fleet.connection("cam-02")
    drops: list[bool] = []
    victim.on_connection(lambda up: None if up else drops.append(up))
    transport = MqttTransport(victim, token=fleet.tokens["cam-02"])
    victim.start()
    try:
        assert victim.wait_connected(10)
        wait_for(lambda: len(replica_ids(fleet)) == 2, what="both replicas in the broker's log")
        taken_ids = ("cam-02", "agent-cam-02", *sorted(replica_ids(fleet)), "anything")
        for taken in taken_ids:
            attacker = Client(fleet.broker.port, "cam-01", fleet.tokens["cam-01"], client_id=taken)
            attacker.close()  # refused, or connected under its own id: never under `taken`
        served = [0.0, 0.0]
        for _ in range(20):  # cam-02 still gets its answers, from both replicas
            answer = transport.infer(light_request(digits(1)), timeout=10)
            assert answer.outputs["probabilities"].shape == (1, 10)
        for index, replica in enumerate(fleet.gateways):
            served[index] = sample(replica, "gateway_requests_total", model="digits-light",
                                   protocol="mqtt", status="ok")  # fmt: skip
        assert min(served) >= 1, served
        assert drops == [], "the victim was disconnected"
        assert [takeovers(fleet, taken) for taken in taken_ids] == [0] * len(taken_ids)
    finally:
        victim.close()


def test_a_device_connects_only_under_its_own_id(
    fleet: Fleet, request: pytest.FixtureRequest
) -> None:
    token = fleet.tokens["cam-01"]
    before = takeovers(fleet, "cam-01")
    own = Client(fleet.broker.port, "cam-01", token, client_id=client_id("cam-01"))
    assert not own.connack.is_failure
    own.close()
    first = Client(fleet.broker.port, "cam-01", token, client_id="first")
    second = Client(fleet.broker.port, "cam-01", token, client_id="second")
    try:
        if request.node.callspec.params["fleet"] == "dynamic-security":
            for client in (first, second):  # the plugin refuses any other id
                assert client.connack.is_failure and client.connack.value == 0x87
        else:  # the listener gave both cam-01's own id: the second replaced the first
            assert not first.connack.is_failure and not second.connack.is_failure
            wait_for(lambda: takeovers(fleet, "cam-01") > before, what="the first to be replaced")
    finally:
        first.close()
        second.close()
