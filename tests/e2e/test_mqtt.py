"""MQTT against a real Mosquitto: telemetry with store-and-forward, offload over MQTT v5,
rollout announcements, per-device topic isolation, garbage on every topic."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cloud_gateway import GatewayThread
from cloud_gateway.config import MqttBridgeSettings
from cloud_gateway.mqtt.broker import ensure_gateway_password, write_broker_files
from edge_agent.fleet import FleetLink
from edge_agent.mqtt import MqttConnection
from edge_agent.offload import make_transport
from edge_agent.offload.mqtt import MqttTransport
from edge_agent.telemetry import Telemetry, TelemetryQueue
from edge_core.errors import OffloadRejected, OffloadTimeout, ProtocolError
from edge_core.mqtt import MqttSettings
from edge_core.protocol.mqtt import (
    decode_request,
    decode_response,
    encode_error,
    encode_request,
    encode_response,
    request_topic,
)
from edge_core.protocol.types import InferRequest, InferResponse
from tests.support.broker import TestBroker
from tests.support.gateway import registry_in
from tests.support.mqtt_agent import CountingConnection
from tests.support.mqtt_fleet import (
    GATEWAY_USER,
    Client,
    Fleet,
    digits,
    light_request,
    running_fleet,
    sample,
)
from tests.support.paths import MODELS, ROOT
from tests.support.waiting import wait_for

pytestmark = pytest.mark.broker


def seqs(messages: list[Any]) -> list[int]:
    return [json.loads(m.payload)["seq"] for m in messages]


def once(messages: list[Any]) -> list[Any]:
    """The first delivery of each message, as a consumer de-duplicates: by (device, seq).

    Delivery is at least once. A repeat may be a broker redelivery (flagged DUP:
    Mosquitto 2.0.11 sends a persistent subscriber some messages it had
    acknowledged again after a restart) or a new publish (DUP unset: an agent
    restarted after a ``kill -9`` sends the rows the killed one had not deleted).
    """
    seen: set[tuple[str, int]] = set()
    first = []
    for message in messages:
        document = json.loads(message.payload)
        key = (document["device"], document["seq"])
        if key not in seen:
            seen.add(key)
            first.append(message)
    return first


# -- the wire form --------------------------------------------------------------------------


def test_requests_and_responses_round_trip_in_the_binary_form() -> None:
    x = np.arange(128, dtype=np.float32).reshape(2, 64)
    request = InferRequest(
        inputs={"pixels": x}, datatypes={"pixels": "FP32"}, model_name="digits-light",
        model_version="1", id="r1",
    )  # fmt: skip
    message = encode_request(request, token="cam-01.secret")
    assert message.properties["authorization"] == "Bearer cam-01.secret"
    assert x.tobytes() in message.payload  # binary, not JSON numbers
    back = decode_request(request_topic("digits-light"), message.payload, message.properties)
    assert back.model_name == "digits-light" and back.model_version == "1"
    assert np.array_equal(back.inputs["pixels"], x)
    response = InferResponse(
        model_name="digits-light", model_version="1", outputs={"p": x[:, :10]}, id="r1"
    )
    encoded = encode_response(response, request)
    status, decoded = decode_response(encoded.payload, encoded.properties)
    assert status == 200 and isinstance(decoded, InferResponse)
    assert np.array_equal(decoded.outputs["p"], x[:, :10])
    error = encode_error(404, "unknown model 'nope'")
    assert decode_response(error.payload, error.properties) == (404, "unknown model 'nope'")


@pytest.mark.parametrize(
    ("topic", "payload", "properties", "match"),
    [
        ("offload/m/infer", b"\xff\x00", {}, "JSON"),
        ("offload/m/extra/infer", b"{}", {}, "not a request topic"),
        ("offload/m/infer", b"{}", {"inference-header-content-length": "-3"}, "non-negative"),
        ("offload/m/infer", b'{"inputs": 5}', {}, "inputs"),
    ],
)
def test_malformed_requests_are_protocol_errors(
    topic: str, payload: bytes, properties: dict[str, str], match: str
) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_request(topic, payload, properties)


def test_model_names_that_cannot_be_topics_are_refused() -> None:
    for name in ("a/b", "+", "#", ""):
        with pytest.raises(ProtocolError):
            request_topic(name)


# -- telemetry: store and forward -----------------------------------------------------------


def test_a_full_queue_drops_the_oldest_and_counts_them(tmp_path: Path) -> None:
    queue = TelemetryQueue(tmp_path / "q.sqlite", max_messages=10)
    for index in range(25):
        queue.put("devices/cam-01/telemetry/x", lambda seq, i=index: json.dumps([seq, i]).encode())
    assert queue.size == 10 and queue.dropped == 15
    assert [json.loads(p)[1] for _, _, p in queue.head(100)] == list(range(15, 25))
    queue.close()
    again = TelemetryQueue(tmp_path / "q.sqlite", max_messages=10)  # counts survive a restart
    assert again.dropped == 15 and again.size == 10
    again.put("t", lambda seq: str(seq).encode())
    assert json.loads(again.head(100)[-1][2]) == 26  # the sequence goes on
    # the count travels with the next status message
    connection = MqttConnection(MqttSettings(port=1), device_id="cam-01")
    telemetry = Telemetry(connection, again, periodic=lambda: {"status": {"profile": "p"}})
    telemetry.emit_periodic()
    status = json.loads(again.head(100)[-1][2])
    assert status["queue"] == {"waiting": 10, "dropped": 16} and status["profile"] == "p"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[TestBroker]:
    with TestBroker(tmp_path / "broker") as running:
        yield running


def device_telemetry(port: int, queue: Path, **kwargs: Any) -> Telemetry:
    connection = MqttConnection(MqttSettings(port=port), device_id="cam-01")
    telemetry = Telemetry(connection, TelemetryQueue(queue), interval_s=3600, **kwargs)
    connection.start()
    telemetry.start()
    return telemetry


def stop_device(telemetry: Telemetry) -> None:
    telemetry.stop()
    telemetry.connection.close()
    telemetry.queue.close()


def test_telemetry_arrives_in_order_across_a_broker_outage(
    broker: TestBroker, tmp_path: Path
) -> None:
    observer = Client(broker.port, client_id="observer", persistent=True)
    observer.subscribe("devices/+/telemetry/#")
    telemetry = device_telemetry(broker.port, tmp_path / "q.sqlite")
    try:
        assert telemetry.connection.wait_connected(10)
        for index in range(20):
            telemetry.emit("decisions", {"index": index})
        wait_for(lambda: len(observer.received()) == 20, what="the first 20")
        assert telemetry.drain(10)
        broker.stop()
        wait_for(lambda: not telemetry.connection.connected, what="the agent to notice")
        for index in range(20, 60):  # the agent goes on publishing: into its queue
            telemetry.emit("decisions", {"index": index})
        time.sleep(0.5)
        assert telemetry.queue.size == 40
        broker.start()
        assert telemetry.drain(20), "the queue did not empty after the broker came back"
        wait_for(lambda: len(once(observer.received())) == 60, what="all 60")
        time.sleep(0.3)  # nothing more arrives
        messages = once(observer.received())
        assert seqs(messages) == list(range(1, 61))
        assert [json.loads(m.payload)["index"] for m in messages] == list(range(60))
        assert all(m.topic == "devices/cam-01/telemetry/decisions" for m in messages)
    finally:
        stop_device(telemetry)
        observer.close()


def test_an_agent_killed_during_an_outage_loses_nothing(broker: TestBroker, tmp_path: Path) -> None:
    observer = Client(broker.port, client_id="observer", persistent=True)
    observer.subscribe("devices/cam-01/telemetry/#")
    broker.stop()
    queue = tmp_path / "q.sqlite"
    agent = subprocess.Popen(
        [sys.executable, "-m", "tests.support.mqtt_agent", str(broker.port), str(queue), "30"],
        cwd=ROOT, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert agent.stdout is not None and agent.stdout.readline().strip() == b"queued"
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.wait()
    broker.start()
    telemetry = device_telemetry(broker.port, queue)  # the agent, restarted
    try:
        for index in range(30, 35):
            telemetry.emit("decisions", {"index": index})
        assert telemetry.drain(20)
        wait_for(lambda: len(once(observer.received())) >= 35, what="35 messages")
        time.sleep(0.3)
        messages = once(observer.received())
        assert [json.loads(m.payload)["index"] for m in messages] == list(range(35))
        assert seqs(messages) == list(range(1, 36))
    finally:
        stop_device(telemetry)
        observer.close()


@contextlib.contextmanager
def stalled(broker: TestBroker) -> Iterator[None]:
    """The broker stops reading (SIGSTOP), its connections up: what a client sends it
    meanwhile stays in flight, unacknowledged, until it goes on (SIGCONT)."""
    assert broker.process is not None
    broker.process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        broker.process.send_signal(signal.SIGCONT)


def unread(port: int) -> int:
    """The bytes waiting in the receive queues of the sockets bound to ``port`` (Linux)."""
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    total += int(fields[4].split(":")[1], 16)
    return total


def publish_size(topic: str, payload: bytes) -> int:
    """The bytes of an MQTT v5 QoS 1 PUBLISH without properties."""
    remaining = 2 + len(topic.encode()) + 2 + 1 + len(payload)
    return 1 + (1 if remaining < 128 else 2 if remaining < 16384 else 3) + remaining


def test_a_full_queue_counts_only_what_will_not_be_delivered(
    broker: TestBroker, tmp_path: Path
) -> None:
    observer = Client(broker.port, client_id="observer", persistent=True)
    observer.subscribe("devices/+/telemetry/#")
    connection = CountingConnection(MqttSettings(port=broker.port), device_id="cam-01")
    queue = TelemetryQueue(tmp_path / "q.sqlite", max_messages=50)
    telemetry = Telemetry(connection, queue, interval_s=3600)
    connection.start()
    telemetry.start()
    try:
        assert connection.wait_connected(10)
        with stalled(broker):
            for index in range(telemetry.window):
                telemetry.emit("decisions", {"index": index})
            assert connection.wait_handed(telemetry.window, 10)  # all of them in flight
            for index in range(telemetry.window, 132):  # the queue overflows meanwhile
                telemetry.emit("decisions", {"index": index})
        assert telemetry.drain(20)
        # the newest goes out last, on one connection, in order: then all the rest is in
        wait_for(lambda: 132 in seqs(observer.received()), what="the newest message")
        delivered = {json.loads(m.payload)["index"] for m in once(observer.received())}
        assert set(range(telemetry.window)) <= delivered  # what was in flight, delivered
        assert queue.dropped == 132 - len(delivered) == 82  # counted: exactly what is missing
    finally:
        stop_device(telemetry)
        observer.close()


def test_an_agent_killed_in_flight_sends_again_with_dup_unset(
    broker: TestBroker, tmp_path: Path
) -> None:
    observer = Client(broker.port, client_id="observer", persistent=True)
    observer.subscribe("devices/cam-01/telemetry/#")
    queue = tmp_path / "q.sqlite"
    command = [sys.executable, "-m", "tests.support.mqtt_agent", str(broker.port), str(queue)]
    agent = subprocess.Popen(
        [*command, "10", "--handed"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert agent.stdin is not None and agent.stdout is not None
    try:
        assert agent.stdout.readline().strip() == b"connected"
        with stalled(broker):  # the ten go out, and the agent dies before any PUBACK
            agent.stdin.write(b"go\n")
            agent.stdin.flush()
            assert agent.stdout.readline().strip() == b"queued"
            waiting = TelemetryQueue(queue)  # the rows the agent sent: all on the wire?
            sent = sum(publish_size(topic, payload) for _, topic, payload in waiting.head(10))
            waiting.close()
            wait_for(lambda: unread(broker.port) >= sent, what="the ten at the broker")
            agent.send_signal(signal.SIGKILL)
            agent.wait()
    finally:
        agent.kill()
        agent.wait()
    telemetry = device_telemetry(broker.port, queue)  # the agent, restarted
    try:
        assert telemetry.drain(20)
        # the killed agent's messages, as many as the broker read before it saw the reset,
        # then the restarted agent's ten, in order: the last is seq 10 again
        wait_for(lambda: len(observer.received()) > 10 and seqs(observer.received())[-1] == 10)
        messages = observer.received()
        again = [m for i, m in enumerate(messages) if seqs([m])[0] in seqs(messages[:i])]
        assert again and not any(m.dup for m in again)  # repeats, and not redeliveries
        assert seqs(once(messages)) == list(range(1, 11))
    finally:
        stop_device(telemetry)
        observer.close()


def test_status_is_retained_online_and_the_last_will_says_offline(broker: TestBroker) -> None:
    connection = MqttConnection(MqttSettings(port=broker.port), device_id="cam-01")
    connection.start()
    assert connection.wait_connected(10)
    late = Client(broker.port)
    late.subscribe("devices/cam-01/status")
    wait_for(lambda: late.received(), what="the retained status")
    assert json.loads(late.received()[-1].payload)["state"] == "online"
    connection._client._sock.close()  # the link dies without a DISCONNECT: the will is sent
    wait_for(lambda: json.loads(late.received()[-1].payload)["state"] == "offline", what="the will")
    connection.close()
    late.close()


# -- a fleet: registry, broker with the generated ACL, gateway with its MQTT bridge ---------


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("fleet")) as running:
        yield running


def test_offload_over_mqtt_answers_as_grpc_does(fleet: Fleet) -> None:
    gateway = fleet.gateways[0]
    connection = fleet.connection("cam-01")
    transport = MqttTransport(connection, token=fleet.tokens["cam-01"])
    connection.start()
    grpc = make_transport("grpc", gateway.grpc_url, token=fleet.tokens["cam-01"])
    try:
        assert connection.wait_connected(10)
        x = digits()
        over_mqtt = transport.infer(light_request(x), timeout=10, request_id="abc")
        over_grpc = grpc.infer(light_request(x), timeout=10)
        assert over_mqtt.model_name == "digits-light" and over_mqtt.id == "r1"
        assert set(over_mqtt.outputs) == set(over_grpc.outputs)
        for name, array in over_grpc.outputs.items():
            assert np.array_equal(over_mqtt.outputs[name], array)
        unknown = InferRequest(
            inputs={"pixels": x}, datatypes={"pixels": "FP32"}, model_name="nope"
        )
        with pytest.raises(OffloadRejected, match="unknown model 'nope'") as info:
            transport.infer(unknown, timeout=10)
        assert info.value.status == "404"
        wrong = light_request(np.zeros((1, 3), np.float32))
        with pytest.raises(OffloadRejected, match="shape"):
            transport.infer(wrong, timeout=10)
        before = sample(gateway, "gateway_mqtt_dropped_total", reason="unauthenticated")
        transport.token = "cam-01.forged"  # no answer: it could name any response topic
        with pytest.raises(OffloadTimeout):
            transport.infer(light_request(x), timeout=0.5)
        transport.token = fleet.tokens["cam-01"]
        wait_for(
            lambda: (
                sample(gateway, "gateway_mqtt_dropped_total", reason="unauthenticated")
                == before + 1
            ),
            what="the forged request counted",
        )
        assert sample(gateway, "gateway_requests_total", model="digits-light", protocol="mqtt",
                      status="ok") >= 1  # fmt: skip
    finally:
        connection.close()
        grpc.close()


def test_two_gateway_replicas_share_the_requests(fleet: Fleet) -> None:
    first = fleet.gateways[0]
    second = fleet.start_gateway()
    connection = fleet.connection("cam-01")
    transport = MqttTransport(connection, token=fleet.tokens["cam-01"])
    connection.start()
    try:
        assert connection.wait_connected(10)

        def served(thread: GatewayThread) -> float:
            return sample(
                thread, "gateway_requests_total", model="digits-light", protocol="mqtt", status="ok"
            )

        before = served(first), served(second)
        x = digits(1)
        for _ in range(40):
            transport.infer(light_request(x), timeout=10)
        took = served(first) - before[0], served(second) - before[1]
        assert sum(took) == 40
        assert min(took) >= 5, took  # both replicas took part
    finally:
        connection.close()
        second.stop()
        fleet.gateways.remove(second)


def test_with_no_gateway_the_agent_falls_back_within_the_deadline(
    broker: TestBroker, tmp_path: Path
) -> None:
    from edge_agent.assemble import create_agent, create_connection
    from edge_agent.config import load_agent_config

    token = tmp_path / "device.token"
    token.write_text("cam-01.token\n")
    token.chmod(0o600)
    config_file = tmp_path / "agent.toml"
    config_file.write_text(
        f"""device_id = "cam-01"
profile = "generic-x86_64"
model_dir = "{MODELS}"
state_dir = "{tmp_path / "state"}"
[gateway]
protocol = "mqtt"
token_file = "device.token"
retries = 0
[mqtt]
port = {broker.port}
[telemetry]
enabled = false
[privacy]
face_detector = false
"""
    )
    config = load_agent_config(config_file)
    connection = create_connection(config)
    agent = create_agent(config, connection=connection)
    connection.start()
    try:
        assert connection.wait_connected(10)
        x = digits(1)
        for _ in range(3):
            started = time.monotonic()
            result = agent.infer("digits-heavy", {"pixels": x}, deadline_ms=300)  # cloud only
            elapsed = time.monotonic() - started
            assert result.degraded and result.model == "digits-light"  # the local stand-in
            assert elapsed < 0.3 + 0.15, elapsed  # the deadline, and room for a busy machine
            assert "no answer over MQTT" in (result.error or "") or "breaker" in (
                result.error or ""
            )
    finally:
        agent.close()
        connection.close()


def test_a_lost_broker_is_unavailable_at_once(broker: TestBroker) -> None:
    connection = MqttConnection(MqttSettings(port=broker.port), device_id="cam-01")
    transport = MqttTransport(connection)
    connection.start()
    assert connection.wait_connected(10)
    broker.stop()
    wait_for(lambda: not connection.connected, what="the disconnect")
    from edge_core.errors import OffloadUnavailable

    request = light_request(digits(1))
    started = time.monotonic()
    with pytest.raises(OffloadUnavailable, match="not connected"):
        transport.infer(request, timeout=5)
    assert time.monotonic() - started < 0.5  # at once, not after the 5 s timeout
    broker.start()
    assert connection.wait_connected(10)
    with pytest.raises(OffloadTimeout):  # connected, but nobody answers
        transport.infer(light_request(digits(1)), timeout=0.3)
    connection.close()


# -- isolation ------------------------------------------------------------------------------


def test_the_generated_acl_keeps_devices_to_their_own_topics(fleet: Fleet) -> None:
    intruder = fleet.client("cam-01")
    victim = fleet.client("cam-02")
    cloud = fleet.client(GATEWAY_USER)
    try:
        for topic in ("devices/cam-02/telemetry/#", "devices/cam-02/responses", "fleet/g2/models"):
            intruder.subscribe(topic)  # Mosquitto checks reads on delivery (see broker.py)
        victim.subscribe("devices/cam-02/responses")
        victim.subscribe("fleet/g2/models")
        cloud.subscribe("devices/+/telemetry/#")
        # what is cam-02's reaches cam-02 and the cloud, never cam-01
        assert not victim.publish("devices/cam-02/telemetry/status", b"{}").is_failure
        assert not cloud.publish("devices/cam-02/responses", b"{}").is_failure
        assert not cloud.publish("fleet/g2/models", b"{}").is_failure
        wait_for(lambda: len(victim.received()) == 2, what="cam-02's own messages")
        wait_for(lambda: cloud.received("devices/cam-02/telemetry/#"), what="the telemetry")
        time.sleep(0.3)
        assert intruder.received() == []
        # and cam-01 may not publish on cam-02's topics, or announce: PUBACK 0x87
        for topic in (
            "devices/cam-02/telemetry/status",
            "devices/cam-02/status",
            "devices/cam-02/responses",
            "devices/cam-02/streams/door/results",
            "fleet/g1/models",
        ):
            reason = intruder.publish(topic, b"forged")
            assert reason.value == 0x87, (topic, reason)
        time.sleep(0.3)
        assert all(m.payload != b"forged" for m in victim.received() + cloud.received())
        # its own topics are fine, its streams' results included, which the cloud reads
        assert not intruder.publish("devices/cam-01/telemetry/status", b"{}").is_failure
        cloud.subscribe("devices/+/streams/+/results")
        assert not intruder.publish("devices/cam-01/streams/door/results", b"{}").is_failure
        wait_for(lambda: cloud.received("devices/cam-01/streams/door/results"), what="results")
    finally:
        for client in (intruder, victim, cloud):
            client.close()


def test_a_devices_bad_seq_never_keeps_another_devices_status_from_updating(
    fleet: Fleet,
) -> None:
    """Through the broker and the bridge: cam-01 sends a seq of 2^64 five times a second
    (every once-a-second batch held one, and the whole batch failed); cam-02's status is
    written all the same, and cam-01's refused ones are counted."""
    bad, good = fleet.client("cam-01"), fleet.client("cam-02")
    gateway = fleet.gateways[0].gateway
    dropped = {"reason": "malformed"}
    before = gateway.metrics.registry.get_sample_value("gateway_telemetry_dropped_total", dropped)
    profile = f"good-{uuid.uuid4().hex[:8]}"
    try:
        stop = threading.Event()

        def flood() -> None:
            while not stop.wait(0.2):
                bad.publish("devices/cam-01/telemetry/status",
                            json.dumps({"profile": "bad", "seq": 2**64}).encode())  # fmt: skip

        flooding = threading.Thread(target=flood, daemon=True)
        flooding.start()
        try:
            time.sleep(0.5)
            for seq in range(1, 4):  # three statuses, a second apart, as a device would
                good.publish("devices/cam-02/telemetry/status",
                             json.dumps({"profile": profile, "seq": seq}).encode())  # fmt: skip
                time.sleep(1.0)
            wait_for(
                lambda: (gateway.fleet.status("cam-02") or {}).get("profile") == profile,
                timeout=10, what="cam-02's status written",
            )  # fmt: skip
        finally:
            stop.set()
            flooding.join(5)
        assert (gateway.fleet.status("cam-01") or {}).get("profile") != "bad"
        after = gateway.metrics.registry.get_sample_value(
            "gateway_telemetry_dropped_total", dropped
        )
        assert (after or 0) - (before or 0) >= 5
    finally:
        bad.close()
        good.close()


def test_a_device_cannot_take_the_gateways_share_of_the_requests(fleet: Fleet) -> None:
    intruder = fleet.client("cam-02")
    connection = fleet.connection("cam-01")
    transport = MqttTransport(connection, token=fleet.tokens["cam-01"])
    connection.start()
    try:
        for group in ("gateways", "gateway", "edge"):  # the names one might guess
            intruder.subscribe(f"$share/{group}/offload/+/infer")
        assert connection.wait_connected(10)
        for _ in range(12):  # round robin would hand an intruder in the group every other
            transport.infer(light_request(digits(1)), timeout=5)
        assert intruder.received() == []
    finally:
        connection.close()
        intruder.close()


def test_wrong_passwords_and_revoked_devices_are_refused(fleet: Fleet) -> None:
    wrong = Client(fleet.broker.port, "cam-01", "cam-01.wrong")
    assert wrong.connack.is_failure and wrong.connack.value in (0x86, 0x87)
    wrong.close()
    nobody = Client(fleet.broker.port)
    assert nobody.connack.is_failure  # no anonymous clients
    nobody.close()
    token = fleet.registry.add("cam-03", "g1")
    fleet.write_acl()
    fleet.broker.reload()
    ok = Client(fleet.broker.port, "cam-03", token)
    assert not ok.connack.is_failure
    ok.close()
    fleet.registry.revoke("cam-03")
    fleet.write_acl()
    fleet.broker.reload()
    revoked = Client(fleet.broker.port, "cam-03", token)
    assert revoked.connack.is_failure
    revoked.close()


# -- garbage --------------------------------------------------------------------------------


class CountingUpdater:
    def __init__(self) -> None:
        self.wakes = 0
        self.listeners: list[Any] = []

    def wake(self) -> None:
        self.wakes += 1


GARBAGE = [b"", b"\xff\x00\xfe", b"{", b"[]", b'{"digest": 5}', b"null", os.urandom(70_000)]


def test_garbage_on_every_subscribed_topic_is_survived_and_counted(fleet: Fleet) -> None:
    gateway = fleet.gateways[0]
    connection = fleet.connection("cam-01")
    transport = MqttTransport(connection, token=fleet.tokens["cam-01"])
    reasons = ("unauthenticated", "no_response_topic", "foreign_response_topic", "no_correlation")
    before = {r: sample(gateway, "gateway_mqtt_dropped_total", reason=r) for r in reasons}
    updater = CountingUpdater()
    FleetLink(connection, updater=updater, group="g1")
    connection.start()
    cloud = fleet.client(GATEWAY_USER)
    device = fleet.client("cam-02")  # bare, beside cam-01's agent: one connection a device
    try:
        assert connection.wait_connected(10)
        device.subscribe("devices/cam-02/responses")
        # the agent's topics: announcements and responses (only the gateway may publish)
        for payload in GARBAGE:
            cloud.publish("fleet/g1/models", payload)
            cloud.publish("devices/cam-01/responses", payload)  # no correlation data
            cloud.publish("devices/cam-01/responses", payload, correlation=b"not-a-request")
        wait_for(
            lambda: (
                connection.dropped["fleet/g1/models"] == len(GARBAGE)
                and connection.dropped["devices/cam-01/responses"] == len(GARBAGE)
            ),
            what="the agent's drop counts",
        )
        wait_for(lambda: transport.unmatched == len(GARBAGE), what="unmatched responses")
        assert updater.wakes == 0
        # the gateway's topic: requests without a token, answer topic or correlation, and
        # requests with a good token but a bad body (answered: 400)
        token = {"authorization": f"Bearer {fleet.tokens['cam-02']}"}
        mine = "devices/cam-02/responses"
        for payload in GARBAGE:
            device.publish("offload/digits-light/infer", payload, response_topic=mine,
                           correlation=b"c1")  # fmt: skip
            device.publish("offload/digits-light/infer", payload, user=token, correlation=b"c2")
            device.publish("offload/digits-light/infer", payload, user=token,
                           response_topic="devices/cam-01/responses", correlation=b"c3")  # fmt: skip
            device.publish("offload/digits-light/infer", payload, user=token, response_topic=mine)
            device.publish("offload/digits-light/infer", payload, user=token,
                           response_topic=mine, correlation=b"c5")  # fmt: skip

        def dropped(reason: str) -> float:
            return sample(gateway, "gateway_mqtt_dropped_total", reason=reason) - before[reason]

        wait_for(
            lambda: all(dropped(reason) == len(GARBAGE) for reason in reasons),
            what="the gateway's drop counts",
        )

        def answered(correlation: bytes) -> list[Any]:
            return [
                m for m in device.received(mine)
                if getattr(m.properties, "CorrelationData", None) == correlation
            ]  # fmt: skip

        wait_for(lambda: len(answered(b"c5")) == len(GARBAGE), what="400 answers")
        assert all(dict(m.properties.UserProperty)["status"] == "400" for m in answered(b"c5"))
        assert not answered(b"c1") + answered(b"c2") + answered(b"c3")
        # both sides still work
        response = transport.infer(light_request(digits(1)), timeout=10)
        assert response.outputs
        cloud.publish("fleet/g1/models", b'{"digest": "abc"}')
        wait_for(lambda: updater.wakes == 1, what="a real announcement")
    finally:
        connection.close()
        cloud.close()
        device.close()


# -- rollout announcements ------------------------------------------------------------------


def test_a_rollout_announcement_starts_an_update_at_once(tmp_path: Path) -> None:
    from dataclasses import replace

    from tests.support.ota_world import GROUP, LIGHT_INT8, make_world

    world = make_world(tmp_path)
    device = world.enroll("cam-07")
    password = ensure_gateway_password(world.state / "mqtt-gateway.password")
    registry = registry_in(world.state)
    write_broker_files(registry, tmp_path, gateway_user=GATEWAY_USER, gateway_password=password)
    broker = TestBroker(
        tmp_path / "broker", passwd=tmp_path / "passwd",
        gateway_passwd=tmp_path / "gateway-passwd", acl=tmp_path / "acl",
    )  # fmt: skip
    broker.start()
    world.gateway.stop()
    world.gateway = GatewayThread(
        replace(
            world.gateway.gateway.config,
            mqtt=MqttBridgeSettings(port=broker.gateway_port, announce_interval_s=0.2),
        )
    )
    updater = world.updater(device, interval_s=3600, jitter_s=0)  # no interval check soon
    settings = MqttSettings(port=broker.port, password=device.enrollment.token)
    connection = MqttConnection(settings, device_id="cam-07")
    link = FleetLink(connection, updater=updater, group=GROUP)
    checks: list[Any] = []
    updater.listeners.append(checks.append)
    first_check = threading.Event()
    check = updater.check

    def check_once_seen() -> Any:
        try:
            return check()
        finally:
            first_check.set()

    updater.check = check_once_seen  # type: ignore[method-assign]
    worker = threading.Thread(target=updater.run, daemon=True)
    try:
        link.start()
        assert connection.wait_connected(10)
        worker.start()
        assert first_check.wait(20)  # the first check (at start) finds nothing to do
        assert world.store(device).active("digits-light") is None
        world.release("digits-light", 2, LIGHT_INT8)
        wait_for(lambda: checks, timeout=20, what="the update")
        assert world.store(device).active("digits-light").version == 2
        assert link.announcements == 1
        assert [outcome.status for outcome in checks] == ["installed"]
    finally:
        updater.stop()
        worker.join(10)
        link.stop()
        world.stop()
        broker.stop()


# -- configuration and the broker's files ---------------------------------------------------


def test_mqtt_acl_writes_the_brokers_files_from_the_registry(tmp_path: Path, capsys: Any) -> None:
    from cloud_gateway.cli import main

    state = tmp_path / "state"
    registry = registry_in(state)
    registry.add("cam-01", "g1")
    registry.add("cam-02", "g2")
    registry.revoke("cam-02")
    out = tmp_path / "broker"
    command = ["--state-dir", str(state), "mqtt", "acl", "--out", str(out)]
    assert main([*command, "--broker-group", "none"]) == 0
    users = [line.split(":")[0] for line in (out / "passwd").read_text().splitlines()]
    assert users == ["cam-01"]  # revoked devices are left out, the gateway has its own
    assert (out / "gateway-passwd").read_text().startswith("_gateway:$7$")
    assert len((out / "gateway-passwd").read_text().splitlines()) == 1
    acl = (out / "acl").read_text()
    assert "user cam-01\ntopic read fleet/g1/models\n" in acl and "cam-02" not in acl
    dynsec = json.loads((out / "dynamic-security.json").read_text())
    assert [c["username"] for c in dynsec["clients"]] == ["_gateway", "cam-01"]
    # each device may connect with its own client id only; the replicas each have one
    assert [c.get("clientid") for c in dynsec["clients"]] == [None, "cam-01"]
    assert dynsec["defaultACLAccess"]["subscribe"] is False
    for path in (
        out / "passwd",
        out / "gateway-passwd",
        out / "acl",
        out / "dynamic-security.json",
        state / "mqtt-gateway.password",
    ):
        assert path.stat().st_mode & 0o777 == 0o600, path
    password = (state / "mqtt-gateway.password").read_text()
    gid = os.getgid()  # with the broker's group: its files 0640, the gateway's own still 0600
    group = grp.getgrgid(gid).gr_name
    assert main([*command, "--broker-group", group]) == 0
    for path in (
        out / "passwd",
        out / "gateway-passwd",
        out / "acl",
        out / "dynamic-security.json",
    ):
        assert (path.stat().st_mode & 0o777, path.stat().st_gid) == (0o640, gid), path
    assert (state / "mqtt-gateway.password").stat().st_mode & 0o777 == 0o600
    assert main([*command, "--broker-group", "no-such-group-here"]) == 1
    assert (state / "mqtt-gateway.password").read_text() == password  # kept, not regenerated
    printed = capsys.readouterr().out
    assert "SIGHUP" in printed and "dynamic security plugin" in printed


def write_agent_config(tmp: Path, body: str) -> Path:
    token = tmp / "device.token"
    token.write_text("cam-01.secret\n")
    token.chmod(0o600)
    path = tmp / "agent.toml"
    path.write_text(f'device_id = "cam-01"\nstate_dir = "{tmp}/state"\n' + body)
    return path


def test_agent_mqtt_configuration(tmp_path: Path) -> None:
    from edge_agent.assemble import create_connection
    from edge_agent.config import load_agent_config
    from edge_core.errors import ConfigError

    config = load_agent_config(
        write_agent_config(
            tmp_path,
            '[gateway]\nprotocol = "mqtt"\ntoken_file = "device.token"\n'
            '[mqtt]\nhost = "broker.local"\nport = 8883\n',
        )
    )
    assert config.telemetry is not None and config.telemetry.interval_s == 30  # on by default
    connection = create_connection(config)
    assert connection.settings.username == "cam-01"
    assert connection.settings.password == "cam-01.secret"  # the device's token
    for body, match in (
        ('[gateway]\nprotocol = "mqtt"\n', r"mqtt needs an \[mqtt\] section"),
        ("[telemetry]\nenabled = true\n", r"telemetry needs an \[mqtt\] section"),
        ("[mqtt]\nport = 70000\n", "port: expected an integer >= 1 and <= 65535"),
        ('[mqtt]\npassword_file = "missing"\n', "password_file: cannot read"),
    ):
        with pytest.raises(ConfigError, match=match):
            load_agent_config(write_agent_config(tmp_path, body))
    with pytest.raises(ConfigError, match="needs a password"):
        create_connection(load_agent_config(write_agent_config(tmp_path, "[mqtt]\n")))
