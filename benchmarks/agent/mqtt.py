"""``python -m benchmarks mqtt``: telemetry throughput and offload round trips through Mosquitto.

One run on loopback, with the generated password and ACL files in force:

- telemetry: messages per second from ``Telemetry.emit`` (the on-disk queue,
  QoS 1, acknowledged and deleted) until an independent subscriber has them
  all; beside it, bare paho QoS 1 publishes of the same messages (no queue),
  to show what the store-and-forward costs;
- offload: the same one-row ``digits-light`` request over MQTT (device ->
  broker -> gateway bridge -> broker -> device) and over gRPC, interleaved,
  p50/p99 of each.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.agent.hybrid import gateway_process
from benchmarks.agent.mosquitto import Mosquitto
from edge_agent.mqtt import MqttConnection
from edge_agent.telemetry import Telemetry, TelemetryQueue
from edge_core.errors import OffloadError
from edge_core.mqtt import MqttSettings, new_client
from edge_core.protocol.types import InferRequest
from edge_core.report import machine_info, percentiles_ms, render_table
from edge_core.repository import ModelRepository

__all__ = ["format_mqtt", "run_mqtt"]

DEVICE = "bench-device"


def _light_request(model_dir: Path) -> InferRequest:
    x = ModelRepository(model_dir).get("digits-light").evaluation()[0][:1]
    return InferRequest(
        inputs={"pixels": np.asarray(x, dtype=np.float32)},
        datatypes={"pixels": "FP32"},
        model_name="digits-light",
    )


class _Counter:
    """An independent subscriber (the gateway's broker user) counting arrivals."""

    def __init__(self, port: int, password: str, topic: str) -> None:
        self.count = 0
        self.done = threading.Event()
        self.expected = 0
        self._client = new_client("bench-observer", "_gateway", password, None)
        self._client.on_message = self._on_message
        subscribed = threading.Event()
        self._client.on_subscribe = lambda *args: subscribed.set()
        self._client.on_connect = lambda client, *args: client.subscribe(topic, qos=1)
        self._client.connect("127.0.0.1", port)
        self._client.loop_start()
        if not subscribed.wait(10):
            raise OffloadError("the observer could not subscribe")

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        self.count += 1
        if self.count >= self.expected:
            self.done.set()

    def expect(self, count: int) -> None:
        self.count, self.expected = 0, count
        self.done.clear()

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def _telemetry(
    connection: MqttConnection, observer: _Counter, root: Path, messages: int
) -> dict[str, Any]:
    body = {"decisions": [{"action": "local", "reason": "fits", "count": 12345}]}
    # through the queue, as the agent sends
    telemetry = Telemetry(connection, TelemetryQueue(root / "telemetry.sqlite"), interval_s=3600)
    telemetry.start()
    observer.expect(messages)
    started = time.perf_counter()
    for _ in range(messages):
        telemetry.emit("decisions", body)
    if not observer.done.wait(120):
        raise OffloadError(f"only {observer.count} of {messages} telemetry messages arrived")
    queued = time.perf_counter() - started
    telemetry.stop()
    telemetry.queue.close()
    # bare QoS 1 publishes of the same payload, no queue
    payload = json.dumps({"device": DEVICE, "seq": 1, "time": time.time(), **body}).encode()
    observer.expect(messages)
    started = time.perf_counter()
    for _ in range(messages):
        connection.publish(f"devices/{DEVICE}/telemetry/decisions", payload, qos=1)
    if not observer.done.wait(120):
        raise OffloadError(f"only {observer.count} of {messages} bare messages arrived")
    bare = time.perf_counter() - started
    return {
        "messages": messages,
        "payload_bytes": len(payload),
        "queued_per_s": round(messages / queued, 1),
        "bare_per_s": round(messages / bare, 1),
        "queued_vs_bare": round(bare / queued, 3),
    }


def _round_trips(mqtt: Any, grpc: Any, request: InferRequest, requests: int) -> dict[str, Any]:
    for transport in (mqtt, grpc):  # warm up connections, batchers, caches
        for _ in range(20):
            transport.infer(request, timeout=10)
    samples: dict[str, list[int]] = {"mqtt": [], "grpc": []}
    outputs: dict[str, Any] = {}
    for _ in range(requests):
        for name, transport in (("mqtt", mqtt), ("grpc", grpc)):
            started = time.perf_counter_ns()
            response = transport.infer(request, timeout=10)
            samples[name].append(time.perf_counter_ns() - started)
            outputs[name] = response.outputs
    same = all(np.array_equal(outputs["mqtt"][k], outputs["grpc"][k]) for k in outputs["grpc"])
    result: dict[str, Any] = {name: percentiles_ms(values) for name, values in samples.items()}
    result["requests"] = requests
    result["same_outputs"] = same
    result["mqtt_vs_grpc_p50"] = round(result["mqtt"]["p50_ms"] / result["grpc"]["p50_ms"], 2)
    return result


def run_mqtt(model_dir: Path, *, messages: int = 5000, requests: int = 300) -> dict[str, Any]:
    from edge_agent.offload import make_transport
    from edge_agent.offload.mqtt import MqttTransport

    report: dict[str, Any] = {"benchmark": "mqtt", "machine": machine_info()}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        state = root / "state"
        broker = Mosquitto(
            root / "broker", passwd=root / "passwd", gateway_passwd=root / "gateway-passwd",
            acl=root / "acl",
        )  # fmt: skip
        served = root / "served"
        served.mkdir()
        (served / "digits-light").symlink_to(model_dir / "digits-light")
        extra = f"[mqtt]\nport = {broker.gateway_port}\n"
        with gateway_process(served, state, extra_config=extra, broker_files=root) as gateway:
            password = (state / "mqtt-gateway.password").read_text().strip()
            broker.start()
            token = gateway["token"]
            connection = MqttConnection(
                MqttSettings(port=broker.port, password=token), device_id=DEVICE
            )
            mqtt = MqttTransport(connection, token=token)
            grpc = make_transport("grpc", gateway["grpc"], token=token)
            observer = _Counter(broker.gateway_port, password, f"devices/{DEVICE}/telemetry/#")
            connection.start()
            try:
                if not connection.wait_connected(10):
                    raise OffloadError("the device could not connect to the broker")
                request = _light_request(model_dir)
                _wait_for_bridge(mqtt, request)
                report["telemetry"] = _telemetry(connection, observer, root, messages)
                report["offload"] = _round_trips(mqtt, grpc, request, requests)
            finally:
                observer.close()
                connection.close()
                grpc.close()
                broker.stop()
    return report


def _wait_for_bridge(mqtt: Any, request: InferRequest) -> None:
    """The gateway's bridge connects on its own schedule (it retries every few seconds)."""
    end = time.monotonic() + 30
    while True:
        try:
            mqtt.infer(request, timeout=1)
            return
        except OffloadError:
            if time.monotonic() > end:
                raise


def format_mqtt(report: dict[str, Any]) -> str:
    telemetry, offload = report["telemetry"], report["offload"]
    lines = [
        f"telemetry: {telemetry['messages']} messages of {telemetry['payload_bytes']} bytes, "
        "QoS 1, through Mosquitto on loopback",
        render_table(
            ["path", "messages/s"],
            [
                ["Telemetry.emit (SQLite queue, ack, delete)", telemetry["queued_per_s"]],
                ["bare paho publish (no queue)", telemetry["bare_per_s"]],
            ],
        ),
        "",
        f"offload round trip: digits-light, 1 row, {offload['requests']} requests each, "
        f"interleaved (same outputs: {offload['same_outputs']})",
        render_table(
            ["transport", "p50 ms", "p95 ms", "p99 ms", "mean ms"],
            [
                [name, s["p50_ms"], s["p95_ms"], s["p99_ms"], s["mean_ms"]]
                for name, s in (("mqtt", offload["mqtt"]), ("grpc", offload["grpc"]))
            ],
        ),
        f"MQTT / gRPC p50: {offload['mqtt_vs_grpc_p50']}x",
    ]
    return "\n".join(lines)
