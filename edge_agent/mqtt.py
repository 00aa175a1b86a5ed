"""The agent's one MQTT connection (paho-mqtt 2, callback API 2, MQTT v5).

Telemetry, offload over MQTT and rollout announcements share it. It
reconnects by itself, keeps a retained ``devices/<id>/status`` (``online``
once connected, ``offline`` as its last will), resubscribes after each
reconnect, and shields paho's network thread from the handlers: a payload a
handler cannot parse is dropped and counted, never a crash. Its client id is
the device's id, the one the broker lets it have (see ``client_id``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from edge_core.mqtt import BrokerWatch, MqttSettings, Published, new_client, no_delay, publish
from edge_core.protocol.mqtt import client_id, status_topic

__all__ = ["MqttConnection"]

log = logging.getLogger(__name__)

Handler = Callable[[Any], None]  # gets a paho MQTTMessage


class MqttConnection:
    def __init__(self, settings: MqttSettings, *, device_id: str) -> None:
        import paho.mqtt.client as mqtt

        self.settings = settings
        self.device_id = device_id
        self._mqtt = mqtt
        self._client = new_client(
            client_id(device_id), settings.username or device_id, settings.password, settings.tls
        )
        self._client.will_set(status_topic(device_id), self._status("offline"), qos=1, retain=True)
        self._watch = BrokerWatch(log, f"device {device_id}", settings)
        self._watch.attach(self._client)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_message = self._on_message
        self._client.on_publish = self._on_publish
        self._handlers: dict[str, Handler] = {}
        self._published: list[Callable[[int, bool], None]] = []
        self._connected = threading.Event()
        self._listeners: list[Callable[[bool], None]] = []
        self.dropped: Counter[str] = Counter()  # read it through dropped_counts()
        self._dropped_lock = threading.Lock()
        self._started = False
        self._closing = False

    @staticmethod
    def _status(state: str) -> str:
        return json.dumps({"state": state, "time": time.time()})

    # -- life ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Connect in the background (and keep reconnecting)."""
        if self._started:
            return
        self._started = True
        self._closing = False
        self._client.connect_async(self.settings.host, self.settings.port, self.settings.keepalive)
        self._client.loop_start()

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def is_connected(self) -> bool:
        return self._connected.is_set()

    def close(self) -> None:
        """Say ``offline`` (a clean stop sends no last will) and disconnect."""
        if not self._started:
            return
        self._closing = True
        if self.connected:
            info = self._client.publish(
                status_topic(self.device_id), self._status("offline"), qos=1, retain=True
            )
            with contextlib.suppress(RuntimeError, ValueError):  # the link went down meanwhile
                info.wait_for_publish(timeout=2)
        self._client.disconnect()
        self._client.loop_stop()
        self._started = False

    def on_connection(self, listener: Callable[[bool], None]) -> None:
        """Call ``listener(connected)`` on every connect and disconnect."""
        self._listeners.append(listener)

    def on_published(self, listener: Callable[[int, bool], None]) -> None:
        """Call ``listener(mid, accepted)`` when the broker acknowledges a QoS 1 publish."""
        self._published.append(listener)

    def forget(self, listener: Callable[..., None]) -> None:
        """Stop calling ``listener`` (given to :meth:`on_connection` or :meth:`on_published`)."""
        for listeners in (self._listeners, self._published):
            if listener in listeners:
                listeners.remove(listener)

    @staticmethod
    def _tell(listeners: list[Callable[..., None]], *args: Any) -> None:
        for listener in list(listeners):
            try:
                listener(*args)
            except Exception:  # paho's network thread must go on
                log.exception("an MQTT connection listener failed")

    # -- messages -----------------------------------------------------------------------------

    def subscribe(self, topic: str, handler: Handler, qos: int = 1) -> None:
        self._handlers[topic] = handler
        if self.connected:
            self._client.subscribe(topic, qos=qos)

    def publish(
        self,
        topic: str,
        payload: bytes | str,
        *,
        qos: int = 1,
        retain: bool = False,
        response_topic: str | None = None,
        correlation: bytes | None = None,
        properties: dict[str, str] | None = None,
        expiry_s: int | None = None,
    ) -> Published:
        """Publish (its ``mid`` is acknowledged later, see :meth:`on_published`)."""
        return publish(
            self._client,
            topic,
            payload,
            qos=qos,
            retain=retain,
            response_topic=response_topic,
            correlation=correlation,
            user=properties,
            expiry_s=expiry_s,
        )

    # -- paho's callbacks (its network thread) ------------------------------------------------

    def _on_connect(
        self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any
    ) -> None:
        if reason.is_failure:
            log.warning(
                "MQTT broker %s:%d refused the connection: %s",
                self.settings.host,
                self.settings.port,
                reason,
            )
            return
        self._watch.connected()
        no_delay(client)
        client.publish(status_topic(self.device_id), self._status("online"), qos=1, retain=True)
        for topic in self._handlers:
            client.subscribe(topic, qos=1)
        self._connected.set()
        log.info("connected to MQTT broker %s:%d", self.settings.host, self.settings.port)
        self._tell(self._listeners, True)

    def _on_disconnect(
        self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any
    ) -> None:
        was = self._connected.is_set()
        self._connected.clear()
        if was and not self._closing:
            log.warning("disconnected from the MQTT broker (%s); reconnecting", reason)
            self._tell(self._listeners, False)

    def _on_publish(
        self, client: Any, userdata: Any, mid: int, reason: Any, properties: Any
    ) -> None:
        accepted = not reason.is_failure
        self._tell(self._published, mid, accepted)

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        for topic, handler in list(self._handlers.items()):  # subscribe() may add one meanwhile
            if self._mqtt.topic_matches_sub(topic, message.topic):
                try:
                    handler(message)
                except Exception as exc:  # a payload its handler cannot take: dropped, counted
                    self._count_drop(topic)
                    log.warning("dropped a message on %s: %s", message.topic, exc)
                return
        self._count_drop("unexpected")

    def _count_drop(self, key: str) -> None:
        with self._dropped_lock:
            self.dropped[key] += 1

    def dropped_counts(self) -> dict[str, int]:
        """Messages dropped as unparsable, by subscription (a copy, safe from any thread)."""
        with self._dropped_lock:
            return dict(self.dropped)
