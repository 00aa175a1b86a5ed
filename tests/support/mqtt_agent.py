"""A device that queues telemetry while its broker is down, then waits to be killed.

python -m tests.mqtt_agent PORT QUEUE COUNT
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from edge_agent.mqtt import MqttConnection
from edge_agent.telemetry import Telemetry, TelemetryQueue
from edge_core.mqtt import MqttSettings


def main() -> None:
    port, queue, count = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    connection = MqttConnection(MqttSettings(port=port), device_id="cam-01")
    telemetry = Telemetry(connection, TelemetryQueue(queue), interval_s=3600)
    connection.start()
    telemetry.start()
    for index in range(count):
        telemetry.emit("decisions", {"index": index})
    print("queued", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main()
