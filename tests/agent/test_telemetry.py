"""Telemetry at a stop: the counts since the last interval are queued on disk, not lost,
even with the broker down."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from edge_agent.fleet import FleetLink
from edge_agent.mqtt import MqttConnection
from edge_agent.telemetry import Telemetry, TelemetryQueue
from edge_core.mqtt import MqttSettings
from edge_core.processes import free_port


@pytest.mark.slow
def test_a_stop_with_the_broker_down_queues_a_final_report(tmp_path: Path) -> None:
    counted = {"requests": 0}

    def periodic() -> dict[str, dict[str, Any]]:
        return {"status": {"profile": "p"}, "decisions": {"requests": counted["requests"]}}

    path = tmp_path / "q.sqlite"
    connection = MqttConnection(MqttSettings(port=free_port()), device_id="cam-01")  # no broker
    telemetry = Telemetry(connection, TelemetryQueue(path), periodic=periodic, interval_s=3600)
    connection.dropped["offload/+/infer"] += 2  # as garbage dropped by a handler
    link = FleetLink(connection, telemetry=telemetry)
    link.start()
    try:
        # the first report goes out at start; then the agent answers 7 requests, and the
        # next report would only come in an hour
        deadline = time.monotonic() + 10
        while telemetry.queue.size < 2:
            assert time.monotonic() < deadline, "no first report"
            time.sleep(0.01)
        counted["requests"] = 7
    finally:
        link.stop(drain_s=0.2)  # as the daemon's SIGTERM does; the queue is closed after

    queue = TelemetryQueue(path)  # what the next start finds on disk
    try:
        messages = [(topic, json.loads(payload)) for _, topic, payload in queue.head(100)]
    finally:
        queue.close()
    assert [topic for topic, _ in messages] == [
        "devices/cam-01/telemetry/status",
        "devices/cam-01/telemetry/decisions",
    ] * 2
    first, final = messages[:2], messages[2:]
    assert first[1][1]["requests"] == 0 and "final" not in first[1][1]
    assert final[1][1]["requests"] == 7 and final[1][1]["final"] is True
    status = final[0][1]
    assert status["final"] is True and status["profile"] == "p"
    assert status["queue"] == {"waiting": 2, "dropped": 0}  # before it
    assert status["mqtt"] == {"dropped": {"offload/+/infer": 2}}
    assert [m["seq"] for _, m in messages] == [1, 2, 3, 4]


def test_a_telemetry_never_started_queues_nothing_at_stop(tmp_path: Path) -> None:
    connection = MqttConnection(MqttSettings(port=free_port()), device_id="cam-01")
    queue = TelemetryQueue(tmp_path / "q.sqlite")
    telemetry = Telemetry(connection, queue, periodic=lambda: {"status": {"profile": "p"}})
    telemetry.stop(drain_s=0.0)
    assert queue.size == 0
    queue.close()
