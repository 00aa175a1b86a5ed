"""The agent's side of the fleet's broker: telemetry and rollout announcements.

One :class:`~edge_agent.mqtt.MqttConnection` carries them (and offload over
MQTT, when the gateway protocol is ``mqtt``). An announcement on the
retained ``fleet/<group>/models`` starts an update check at once; the
updater's interval check stays as the fallback. Each announcement carries a
digest of the group's rollouts, so one seen before (the retained copy after
a reconnect, or a gateway restart) starts nothing.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from edge_agent.mqtt import MqttConnection
from edge_agent.telemetry import Telemetry
from edge_core.errors import ProtocolError
from edge_core.protocol.mqtt import announcement_topic

__all__ = ["FleetLink"]

log = logging.getLogger(__name__)


class FleetLink:
    def __init__(
        self,
        connection: MqttConnection,
        *,
        telemetry: Telemetry | None = None,
        updater: Any = None,
        group: str | None = None,
    ) -> None:
        self.connection = connection
        self.telemetry = telemetry
        self.updater = updater
        self.announcements = 0  # the ones that started a check
        self._digest: str | None = None
        if updater is not None and group:
            connection.subscribe(announcement_topic(group), self._on_announcement)
        if updater is not None and telemetry is not None:
            updater.listeners.append(lambda outcome: telemetry.emit("ota", outcome.to_dict()))

    def _on_announcement(self, message: Any) -> None:
        try:
            document = json.loads(message.payload)
        except ValueError as exc:
            raise ProtocolError(f"an announcement is JSON: {exc}") from None
        digest = document.get("digest") if isinstance(document, dict) else None
        if not isinstance(digest, str) or not digest:
            raise ProtocolError("an announcement carries the digest of its group's rollouts")
        if digest == self._digest:
            return
        self._digest = digest
        self.announcements += 1
        log.info("rollout announcement on %s: checking for updates", message.topic)
        self.updater.wake()

    def start(self) -> None:
        self.connection.start()
        if self.telemetry is not None:
            self.telemetry.start()

    def stop(self, drain_s: float = 2.0) -> None:
        """Queue a last telemetry report, send what is queued (for up to ``drain_s``),
        then disconnect; the rest stays on disk."""
        if self.telemetry is not None:
            self.telemetry.stop(drain_s=drain_s)
        self.connection.close()
        if self.telemetry is not None:
            self.telemetry.queue.close()
