"""A device that queues telemetry, then waits to be killed.

python -m tests.support.mqtt_agent PORT QUEUE COUNT [--handed]

Without ``--handed`` the messages are queued at once (the broker is down); with
it, the device prints ``connected`` once it is, waits for a line on stdin, then
queues them and waits until they have all been handed to its connection (in
flight, if the broker is stalled). Then it prints ``queued``.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

from edge_agent.mqtt import MqttConnection
from edge_agent.telemetry import Telemetry, TelemetryQueue
from edge_core.mqtt import MqttSettings, Published

__all__ = ["CountingConnection"]


class CountingConnection(MqttConnection):
    """An agent's connection that counts the publishes handed to it, to wait on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handed = 0
        self._counted = threading.Condition()

    def publish(self, topic: str, payload: bytes | str, **kwargs: Any) -> Published:
        published = super().publish(topic, payload, **kwargs)
        with self._counted:
            self.handed += 1
            self._counted.notify_all()
        return published

    def wait_handed(self, count: int, timeout: float) -> bool:
        with self._counted:
            return self._counted.wait_for(lambda: self.handed >= count, timeout)


def main() -> None:
    port, queue, count = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    handed = sys.argv[4:] == ["--handed"]
    connection = CountingConnection(MqttSettings(port=port), device_id="cam-01")
    telemetry = Telemetry(connection, TelemetryQueue(queue), interval_s=3600)
    connection.start()
    telemetry.start()
    if handed:
        assert connection.wait_connected(10), "no broker"
        print("connected", flush=True)
        sys.stdin.readline()
    for index in range(count):
        telemetry.emit("decisions", {"index": index})
    if handed:
        assert connection.wait_handed(count, 10), "not all handed to the connection"
    print("queued", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main()
