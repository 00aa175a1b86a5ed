"""The link's counters in the daemon's /metrics and telemetry: MQTT payloads dropped as
unparsable, offload responses that matched no request, the exit guard's refusals and the
circuit breaker's state. An agent in this process, a real Mosquitto, no gateway."""

from __future__ import annotations

import http.client
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_agent.service.daemon import Daemon
from edge_core.processes import free_port
from edge_core.protocol.mqtt import response_topic
from tests.support.broker import TestBroker
from tests.support.daemon import metric_value, write_config
from tests.support.mqtt_fleet import Client
from tests.support.paths import MODELS
from tests.support.roots import make_root
from tests.support.waiting import wait_for

pytestmark = pytest.mark.broker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[TestBroker]:
    with TestBroker(tmp_path / "broker") as running:
        yield running


def start_daemon(tmp: Path, broker_port: int) -> tuple[Daemon, int]:
    root = make_root(tmp / "root", cpus=2, temperatures={0: 50_000})
    models = tmp / "models"
    for name in ("digits-light", "digits-heavy"):
        shutil.copytree(MODELS / name, models / name)
    token = tmp / "device.token"
    token.write_text("cam-01.token\n")
    token.chmod(0o600)
    http_port = free_port()
    config = tmp / "agent.toml"
    gateway = (f'[gateway]\nprotocol = "mqtt"\ntoken_file = "{token}"\nretries = 0\n'
               f"[mqtt]\nport = {broker_port}\n[telemetry]\ninterval_s = 3600\n"
               "[breaker]\ncooldown_s = 600\n")  # fmt: skip
    write_config(config, root, models, http_port, 0, gateway)
    daemon = Daemon(config)
    daemon.start()
    return daemon, http_port


def post(port: int, model: str, document: dict[str, Any]) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("POST", f"/v2/models/{model}/infer", json.dumps(document))
    response = connection.getresponse()
    response.read()
    return response.status


def test_metrics_and_telemetry_show_the_links_counters(broker: TestBroker, tmp_path: Path) -> None:
    observer = Client(broker.port)
    observer.subscribe("devices/cam-01/telemetry/status")
    daemon, port = start_daemon(tmp_path, broker.port)
    try:
        assert daemon.connection.wait_connected(10)
        text = daemon.metrics.render().decode()
        assert metric_value(text, "edge_agent_offload_breaker_state", state="closed") == 1.0
        assert metric_value(text, "edge_agent_offload_breaker_state", state="open") == 0.0

        # a picture the device cannot search for faces (no detector), for a model only the
        # cloud has (what it takes cannot be asked over MQTT): the exit guard refuses it
        picture = {"inputs": [{"name": "pixels", "shape": [1, 64, 64], "datatype": "FP32",
                               "data": [0.0] * 4096}]}  # fmt: skip
        assert post(port, "cloud-vision", picture) == 403
        # no gateway answers over the broker: three timeouts open the breaker (the local
        # model answers meanwhile)
        digits = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                              "data": [0.0] * 64}], "parameters": {"timeout": 300_000}}  # fmt: skip
        for _ in range(3):
            assert post(port, "digits-heavy", digits) == 200
        # garbage on the agent's response topic: no correlation data (unparsable, dropped),
        # and a response to a request it never sent (unmatched)
        topic = response_topic("cam-01")
        observer.publish(topic, b"\x00garbage")
        observer.publish(topic, b"\x00garbage", correlation=b"not-a-request-of-ours")
        wait_for(lambda: sum(daemon.connection.dropped.values()) == 1, what="the drop")
        wait_for(lambda: daemon.agent.offload.transport.unmatched == 1, what="the unmatched one")

        status, body = get_metrics(port)
        assert status == 200
        assert metric_value(body, "edge_agent_mqtt_dropped_total", subscription=topic) == 1.0
        assert metric_value(body, "edge_agent_offload_unmatched_responses_total") == 1.0
        assert (
            metric_value(body, "edge_agent_offload_guard_refusals_total", reason="unsearchable")
            == 1.0
        )
        assert metric_value(body, "edge_agent_offload_breaker_state", state="open") == 1.0
        assert metric_value(body, "edge_agent_offload_breaker_state", state="closed") == 0.0
        assert metric_value(body, "edge_agent_offload_breaker_opened_total") == 1.0
    finally:
        daemon.stop()  # the final telemetry report goes to the broker (it is up)
    try:
        wait_for(
            lambda: any(json.loads(m.payload).get("final") for m in observer.received()),
            what="the final status report",
        )
        final = next(
            json.loads(m.payload) for m in observer.received() if json.loads(m.payload).get("final")
        )
        assert final["mqtt"] == {"dropped": {topic: 1}}
        assert final["offload"] == {
            "transport": "mqtt",
            "breaker": "open",
            "breaker_opened": 1,
            "guard_refusals": {"unsearchable": 1},
            "unmatched_responses": 1,
            # nothing answered: no bytes counted, nothing learnt of the link; MQTT cannot
            # list the cloud's models
            "link": {
                "rtt_ms": None,
                "bandwidth_mbit_s": None,
                "bytes_sent": 0,
                "bytes_received": 0,
            },
            "cloud_models": None,
        }
    finally:
        observer.close()


def get_metrics(port: int) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/metrics")
    response = connection.getresponse()
    return response.status, response.read().decode()
