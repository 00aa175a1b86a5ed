"""While the broker is down, a client says so at once and then once a minute, not
nothing for the ~15 s paho spends retrying, and not a line per retry."""

from __future__ import annotations

import logging
import time

import pytest

from edge_core.mqtt import BrokerWatch, MqttSettings, new_client
from edge_core.processes import free_port


def test_an_outage_is_said_at_once_then_once_a_minute_then_its_end() -> None:
    now = [100.0]
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("test.broker-watch")
    logger.addHandler(Collect())
    logger.setLevel(logging.INFO)
    watch = BrokerWatch(
        logger, "the gateway's bridge", MqttSettings(port=1884), clock=lambda: now[0]
    )
    for _ in range(30):  # paho retries every few seconds: 30 attempts in 2 minutes
        watch.failed()
        now[0] += 4
    assert len(lines) == 2, lines
    assert "the MQTT broker 127.0.0.1:1884 cannot be reached (1 attempt, 0 s); retrying" in lines[0]
    assert "(16 attempts, 60 s)" in lines[1]
    watch.connected()
    assert lines[-1].endswith("is reachable again after 120 s")
    watch.connected()  # a reconnect without an outage says nothing
    assert len(lines) == 3


@pytest.mark.slow
def test_a_real_client_reports_a_broker_that_is_not_there(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()  # nothing listens there
    settings = MqttSettings(port=port)
    client = new_client("watch-test", None, None, None)
    BrokerWatch(logging.getLogger("test.real"), "device cam-01", settings).attach(client)
    with caplog.at_level(logging.WARNING, logger="test.real"):
        client.connect_async("127.0.0.1", port)
        client.loop_start()
        try:
            end = time.monotonic() + 10
            while not caplog.records and time.monotonic() < end:
                time.sleep(0.05)
        finally:
            client.loop_stop()
    assert caplog.records, "nothing said while the broker was unreachable"
    assert f"127.0.0.1:{port} cannot be reached" in caplog.records[0].getMessage()
