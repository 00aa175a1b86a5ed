"""A fleet on a real Mosquitto for the MQTT tests: a gateway with its bridge, devices
signed in as the deployment's accounts, and a bare paho client that records what
happens to it (an independent observer)."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from cloud_gateway import GatewayConfig, GatewayThread
from cloud_gateway.auth import DeviceRegistry
from cloud_gateway.config import MqttBridgeSettings
from cloud_gateway.mqtt.broker import ensure_gateway_password, write_broker_files
from edge_agent.mqtt import MqttConnection
from edge_core.mqtt import MqttSettings, publish_properties
from edge_core.protocol.mqtt import (
    client_id,
)
from edge_core.protocol.types import InferRequest

from .broker import TestBroker
from .gateway import registry_in
from .paths import MODELS
from .waiting import wait_for

GATEWAY_USER = "_gateway"


class Client:
    """A bare paho client that records what happens to it (an independent observer)."""

    def __init__(
        self,
        port: int,
        username: str | None = None,
        password: str | None = None,
        *,
        client_id: str | None = None,
        persistent: bool = False,
    ) -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id or f"observer-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )
        if username:
            self.client.username_pw_set(username, password)
        self.messages: list[Any] = []
        self.acks: dict[int, Any] = {}
        self.connack: Any = None
        self.lock = threading.Lock()
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_publish = lambda c, u, mid, reason, p: self.acks.__setitem__(mid, reason)
        self.client.on_subscribe = lambda c, u, mid, reasons, p: self.acks.__setitem__(mid, reasons)
        self.client.reconnect_delay_set(0.1, 0.5)
        properties = None
        if persistent:  # a session the broker keeps (and queues for) while we are away
            properties = mqtt.Properties(mqtt.PacketTypes.CONNECT)
            properties.SessionExpiryInterval = 3600
        self.client.connect("127.0.0.1", port, clean_start=not persistent, properties=properties)
        self.client.loop_start()
        wait_for(lambda: self.connack is not None, what="CONNACK")

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.connack = reason

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        with self.lock:
            self.messages.append(message)

    def subscribe(self, topic: str) -> Any:
        _, mid = self.client.subscribe(topic, qos=1)
        wait_for(lambda: mid in self.acks, what=f"SUBACK for {topic}")
        return self.acks[mid][0]

    def publish(self, topic: str, payload: bytes, **properties: Any) -> Any:
        info = self.client.publish(
            topic, payload, qos=1, properties=publish_properties(**properties)
        )
        wait_for(lambda: info.mid in self.acks, what=f"PUBACK for {topic}")
        return self.acks[info.mid]

    def received(self, topic: str | None = None) -> list[Any]:
        with self.lock:
            return [
                m for m in self.messages if topic is None or mqtt.topic_matches_sub(topic, m.topic)
            ]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@dataclass
class Fleet:
    root: Path
    registry: DeviceRegistry
    broker: TestBroker
    tokens: dict[str, str]
    gateway_password: str
    config: GatewayConfig
    gateways: list[GatewayThread] = field(default_factory=list)

    def start_gateway(self) -> GatewayThread:
        thread = GatewayThread(self.config)
        self.gateways.append(thread)
        wait_for(lambda: thread.gateway.mqtt.connected.is_set(), what="the bridge to connect")
        return thread

    def connection(self, device: str, password: str | None = None) -> MqttConnection:
        settings = MqttSettings(
            port=self.broker.port, username=device, password=password or self.tokens[device]
        )
        return MqttConnection(settings, device_id=device)

    def client(self, user: str, **kwargs: Any) -> Client:
        """A bare client signed in as ``user``: the gateway's user on the gateways'
        listener, a device on the devices' with its own client id."""
        if user == GATEWAY_USER:
            return Client(self.broker.gateway_port, user, self.gateway_password, **kwargs)
        kwargs.setdefault("client_id", client_id(user))
        return Client(self.broker.port, user, self.tokens[user], **kwargs)

    def write_acl(self) -> None:
        write_broker_files(
            self.registry, self.root, gateway_user=GATEWAY_USER,
            gateway_password=self.gateway_password,
        )  # fmt: skip


def light_repository(tmp: Path, packages: tuple[Path, ...] = ()) -> Path:
    """digits-light, and copies of ``packages`` (model folders)."""
    import shutil

    repository = tmp / "models"
    for package in (MODELS / "digits-light", *packages):
        shutil.copytree(package, repository / package.name)
    return repository


@contextlib.contextmanager
def running_fleet(
    root: Path,
    *,
    dynamic_security: bool = False,
    revoked: tuple[str, ...] = (),
    packages: tuple[Path, ...] = (),
) -> Iterator[Fleet]:
    """cam-01 (group g1) and cam-02 (g2), and ``revoked`` devices (g1), a broker with the
    generated files (the password and ACL files, or the dynamic security plugin's), and
    one gateway bridging it, serving digits-light and ``packages``."""
    state = root / "state"
    registry = registry_in(state)
    tokens = {"cam-01": registry.add("cam-01", "g1"), "cam-02": registry.add("cam-02", "g2")}
    for device in revoked:
        tokens[device] = registry.add(device, "g1")
        registry.revoke(device)
    password = ensure_gateway_password(state / "mqtt-gateway.password")
    files = write_broker_files(registry, root, gateway_user=GATEWAY_USER, gateway_password=password)
    if dynamic_security:
        broker = TestBroker(root / "broker", dynamic_security=files.dynamic_security)
    else:
        broker = TestBroker(
            root / "broker", passwd=files.passwd, gateway_passwd=files.gateway_passwd,
            acl=files.acl,
        )  # fmt: skip
    broker.start()
    config = GatewayConfig(
        repository=light_repository(root, packages), state_dir=state, http_port=0, grpc_port=0,
        poll_interval_s=0.0, mqtt=MqttBridgeSettings(port=broker.gateway_port),
    )  # fmt: skip
    fleet = Fleet(root, registry, broker, tokens, password, config)
    try:
        fleet.start_gateway()
        yield fleet
    finally:
        for gateway in fleet.gateways:
            gateway.stop()
        broker.stop()


def digits(rows: int = 3) -> np.ndarray:
    from edge_core.repository import ModelRepository

    return ModelRepository(MODELS).get("digits-light").evaluation()[0][:rows].astype(np.float32)


def light_request(x: np.ndarray) -> InferRequest:
    return InferRequest(
        inputs={"pixels": x}, datatypes={"pixels": "FP32"}, model_name="digits-light", id="r1"
    )


def sample(thread: GatewayThread, name: str, **labels: str) -> float:
    value = thread.gateway.metrics.registry.get_sample_value(name, labels)
    return float(value or 0.0)
