"""The MQTT bridge: Open Inference Protocol requests through the fleet's broker,
and rollout announcements to the devices.

Requests arrive on the shared subscription ``$share/gateways/offload/+/infer``
(replicas of the gateway split them). Each carries the device's token (a user
property), a response topic, which must be the device's own
``devices/<id>/responses``, and correlation data. A request that cannot be
answered to its sender (no token, no or a foreign response topic, no
correlation data) is dropped and counted in ``gateway_mqtt_dropped_total``;
every other one gets an answer: the response, or an error with its status
(a wrong or revoked token is dropped too: the sender could name any device).

The shared subscription's group name is derived from the gateway's broker
password: Mosquitto's ACL checks a subscription only when it delivers, so a
device that joined the group by name would take its share of the requests
(and be sent nothing); it cannot guess this name.
The data plane does the rest, as for REST and gRPC (batching, deadlines:
the request's ``timeout`` and the message's remaining expiry).

Telemetry: with a telemetry ingest (the dashboard's), the bridge also takes the
devices' ``devices/+/telemetry/#`` through a shared subscription of the same
group (each message reaches one replica), and ``devices/+/status`` (their
retained online / offline) through a plain one: a shared subscription is sent
no retained message. Both go to the ingest in paho's thread (a check and a
dict update; it writes them in batches), never to a request's task.

Announcements: every ``announce_interval_s`` (and whenever a rollout pauses
itself) the rollouts of each group are compared with what was last
announced; a change is published, retained, on ``fleet/<group>/models`` with
a digest the agents use to tell new announcements from repeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from typing import Any

from cloud_gateway.access import Access
from cloud_gateway.auth import parse_bearer
from cloud_gateway.config import MqttBridgeSettings
from cloud_gateway.dataplane import EXTENSIONS, DataPlane
from cloud_gateway.fleet.ingest import TelemetryIngest
from cloud_gateway.mqtt.broker import shared_requests, shared_telemetry
from cloud_gateway.ota.service import OtaService
from edge_core.errors import ProtocolError, RequestError
from edge_core.mqtt import BrokerWatch, new_client, no_delay, publish, user_properties
from edge_core.protocol.mqtt import (
    MqttMessage,
    announcement_topic,
    decode_request,
    encode_error,
    encode_response,
    response_topic,
    status_topic,
)
from edge_core.status import status_of

__all__ = ["MqttBridge", "shared_requests"]

log = logging.getLogger(__name__)


class MqttBridge:
    def __init__(
        self,
        config: MqttBridgeSettings,
        password: str,
        plane: DataPlane,
        access: Access,
        *,
        ota: OtaService | None = None,
        telemetry: TelemetryIngest | None = None,
    ) -> None:
        self.config = config
        self.telemetry = telemetry
        self.plane = plane
        self.access = access
        self.metrics = plane.metrics
        self.ota = ota
        # one client id per replica (Mosquitto disconnects a client whose id another
        # takes); it starts with "_", as no device id does: no device is ever given it
        self._client = new_client(
            f"_gateway-{uuid.uuid4().hex[:12]}", config.username, password, config.tls
        )
        self.requests = shared_requests(password)
        self.telemetry_filter = shared_telemetry(password)
        self._watch = BrokerWatch(log, "the gateway's bridge", config)
        self._watch.attach(self._client)
        self._client.on_connect = self._on_connect
        self._client.on_message = self._on_message
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._announce_task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._announced: dict[str, str] = {}  # group -> digest last published
        self.connected = asyncio.Event()

    # -- life (on the gateway's event loop) -----------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._client.connect_async(
            self.config.host, self.config.port, keepalive=self.config.keepalive
        )
        self._client.loop_start()
        if self.ota is not None:
            self.ota.listeners.append(lambda rollout: self._poke())
            self._announce_task = self._loop.create_task(self._announce_loop())

    async def stop(self) -> None:
        if self._announce_task is not None:
            self._announce_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._announce_task
        self._client.unsubscribe(self.requests)
        if self._tasks:  # the requests already taken are answered
            await asyncio.wait(list(self._tasks), timeout=5)
        self._client.disconnect()
        self._client.loop_stop()

    def _poke(self) -> None:
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    # -- paho's callbacks (its network thread) ------------------------------------------

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if reason.is_failure:
            log.error("the MQTT broker refused the gateway's connection: %s", reason)
            return
        self._watch.connected()
        no_delay(client)
        client.subscribe(self.requests, qos=1)
        if self.telemetry is not None:
            client.subscribe(self.telemetry_filter, qos=1)
            client.subscribe(status_topic("+"), qos=1)
        log.info("MQTT bridge connected to %s:%d", self.config.host, self.config.port)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._connected)

    def _connected(self) -> None:
        # announce again: the broker may have lost its retained messages (the agents
        # tell a repeat by its digest)
        self._announced.clear()
        self.connected.set()
        if self._wake is not None:
            self._wake.set()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        if message.topic.startswith("devices/"):
            if self.telemetry is not None:
                self.telemetry.offer_message(message.topic, message.payload)
            return
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._spawn, message)

    def _spawn(self, message: Any) -> None:
        task = asyncio.get_running_loop().create_task(self._guarded(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- requests ---------------------------------------------------------------------

    def _drop(self, reason: str, message: Any, detail: str = "") -> None:
        self.metrics.mqtt_dropped.labels(reason).inc()
        log.warning("dropped an MQTT message on %s (%s) %s", message.topic, reason, detail)

    async def _guarded(self, message: Any) -> None:
        try:
            await self._handle(message)
        except Exception as exc:  # nothing a message holds may end in an unhandled task
            self._drop("error", message, f"{type(exc).__name__}: {exc}")

    async def _handle(self, message: Any) -> None:
        props = message.properties
        reply_to = getattr(props, "ResponseTopic", None)
        correlation = getattr(props, "CorrelationData", None)
        user = user_properties(message)
        try:
            device = self.access.registry.authenticate(parse_bearer(user.get("authorization")))
        except RequestError as exc:
            # no answer: whoever sent it could name any device's response topic
            return self._drop("unauthenticated", message, str(exc))
        if device.role == "metrics":  # a scraper's token, for /metrics only
            return self._drop("unauthenticated", message, f"{device.id!r} is a metrics token")
        if not reply_to:
            return self._drop("no_response_topic", message)
        if reply_to != response_topic(device.id):
            return self._drop("foreign_response_topic", message, f"{reply_to!r} from {device.id}")
        if not correlation:
            return self._drop("no_correlation", message)
        model = message.topic.split("/")[1] if message.topic.count("/") == 2 else "unknown"
        try:
            self.access.limiter.check(device.id)
            request = decode_request(message.topic, message.payload, user)
        except (RequestError, ProtocolError) as exc:
            self.plane.count_failure(model, "mqtt", exc)
            return self._reply(reply_to, correlation, self._error(exc))
        deadline = None
        expiry = getattr(props, "MessageExpiryInterval", None)
        if expiry:  # what the broker left of the message's life
            deadline = self.plane.clock() + float(expiry)
        try:
            response = await self.plane.infer(
                request,
                device=device,
                protocol="mqtt",
                deadline=deadline,
                request_id=user.get("x-request-id"),
            )
            answer = encode_response(response, request, extensions=EXTENSIONS)
        except Exception as exc:
            answer = self._error(exc)
        self._reply(reply_to, correlation, answer)
        return None

    @staticmethod
    def _error(exc: BaseException) -> MqttMessage:
        status = status_of(exc)
        return encode_error(status.http, status.message)

    def _reply(self, topic: str, correlation: bytes, answer: MqttMessage) -> None:
        publish(
            self._client, topic, answer.payload, correlation=correlation, user=answer.properties
        )

    # -- announcements ------------------------------------------------------------------

    def announcements(self) -> dict[str, dict[str, Any]]:
        """Each group's announcement: its rollouts and their digest."""
        assert self.ota is not None
        groups: dict[str, list[dict[str, Any]]] = {}
        for rollout in self.ota.rollouts.all():
            groups.setdefault(rollout.group, []).append(
                {
                    "name": rollout.name,
                    "version": rollout.version,
                    "percent": rollout.percent,
                    "state": rollout.state,
                }
            )
        out = {}
        for group, rollouts in groups.items():
            digest = hashlib.sha256(json.dumps(rollouts, sort_keys=True).encode()).hexdigest()
            out[group] = {"group": group, "digest": digest, "rollouts": rollouts}
        return out

    async def announce(self) -> int:
        """Publish the announcements that changed; returns how many."""
        if not self._client.is_connected():
            return 0
        loop = asyncio.get_running_loop()
        published = 0
        for group, document in (await loop.run_in_executor(None, self.announcements)).items():
            if self._announced.get(group) == document["digest"]:
                continue
            payload = json.dumps({**document, "time": time.time()}).encode()
            info = publish(self._client, announcement_topic(group), payload, qos=1, retain=True)
            if info.ok:
                self._announced[group] = document["digest"]
                self.metrics.mqtt_announcements.labels(group).inc()
                published += 1
                log.info("announced the rollouts of group %s", group)
        return published

    async def _announce_loop(self) -> None:
        assert self._wake is not None
        while True:
            try:
                await self.announce()
            except Exception:
                log.exception("rollout announcement failed")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.announce_interval_s)
            self._wake.clear()
