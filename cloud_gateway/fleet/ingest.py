"""Telemetry into the state database: taken from the MQTT bridge's thread or a
request, checked, held in memory, written once a second.

:meth:`TelemetryIngest.offer` checks a document (:mod:`.telemetry`) and keeps the
newest of each kind for each device until :meth:`flush` writes them all in one batch
(:class:`~.store.FleetStore`); so a device that reports every 30 s costs the database
a share of one statement a second, not a transaction a message. What is held is
bounded by the registered devices (one document of each kind each): a topic or a
token that names no registered device is dropped and counted
(``gateway_telemetry_dropped_total{reason}``). A repeat (QoS 1 delivers at least once)
or an older message (one queued on the device through an outage) never replaces a
newer one: documents are ordered by the device's sequence number, ``seq``. Every
field is checked where a document enters, over MQTT and HTTP alike (:mod:`.telemetry`),
so what is held always fits the database; should the database still refuse one, the
store drops that one alone (:meth:`~.store.FleetStore.write`), and it is counted
(``reason="refused"``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from cloud_gateway.auth import DeviceRegistry
from cloud_gateway.fleet.store import FleetStore, Sample
from cloud_gateway.fleet.telemetry import KINDS, columns, decode, stamp
from cloud_gateway.metrics import GatewayMetrics
from edge_core.errors import BadRequest, PermissionDenied

__all__ = ["TelemetryIngest"]

log = logging.getLogger(__name__)

STATES = ("online", "offline")


class TelemetryIngest:
    def __init__(
        self,
        registry: DeviceRegistry,
        store: FleetStore,
        metrics: GatewayMetrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.store = store
        self.metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str], Sample] = {}
        self._online: dict[str, tuple[str, float]] = {}

    def _drop(self, reason: str, count: int = 1) -> None:
        self.metrics.telemetry_dropped.labels(reason).inc(count)

    def _known(self, device_id: str) -> bool:
        device = self.registry.get(device_id)
        return device is not None and not device.revoked and device.role == "device"

    def _minute(self, device_time: float | None, now: float) -> int:
        """The history point of a document: the minute the device made it, when that is
        plausible (within the kept history, not in the future), else now's."""
        if device_time is not None and now - self.store.history_s <= device_time <= now + 60:
            return int(device_time // 60)
        return int(now // 60)

    def offer(self, device_id: str, kind: str, document: dict[str, Any], source: str) -> bool:
        """Take one document of ``kind`` from a registered device; whether it was kept
        (a kind that is not kept, or an older one than held, is not).

        Raises:
            BadRequest: the document is not what its kind says.
        """
        if kind not in KINDS:
            return False
        return self._keep(device_id, kind, _checked(kind, document), source)

    def _keep(self, device_id: str, kind: str, checked: _Checked, source: str) -> bool:
        values, (seq, device_time) = checked
        now = self._clock()
        sample = Sample(device_id, kind, now, self._minute(device_time, now), source, seq, values)
        with self._lock:
            held = self._pending.get((device_id, kind))
            if held is not None and held.seq is not None and seq is not None and seq <= held.seq:
                return False
            self._pending[(device_id, kind)] = sample
        self.metrics.telemetry_messages.labels(source).inc()
        return True

    def offer_http(self, device_id: str, body: Any) -> int:
        """A device's ``POST /v2/telemetry``: ``{kind: document}``; how many were kept.

        Raises:
            PermissionDenied: an admin's token, not a device's.
            BadRequest: not an object of documents, or a document that is not what its
                kind says (then none is kept).
        """
        if not self._known(device_id):
            raise PermissionDenied(f"{device_id!r} is not a device: only devices send telemetry")
        if not isinstance(body, dict) or not body:
            raise BadRequest("telemetry: a JSON object of documents by kind (status, ...)")
        unknown = sorted(set(body) - set(KINDS))
        if unknown:
            raise BadRequest(f"telemetry: kind must be one of {', '.join(KINDS)}")
        if not all(isinstance(document, dict) for document in body.values()):
            raise BadRequest("telemetry: each document is a JSON object")
        # all checked before any is kept
        checked = {kind: _checked(kind, document) for kind, document in body.items()}
        return sum(self._keep(device_id, kind, checked[kind], "http") for kind in body)

    def offer_message(self, topic: str, payload: bytes) -> None:
        """An MQTT message on ``devices/<id>/telemetry/<kind>`` or ``devices/<id>/status``
        (paho's thread); a bad one is dropped and counted, never raised."""
        parts = topic.split("/")
        if len(parts) < 3 or parts[0] != "devices":
            return self._drop("topic")
        device_id = parts[1]
        if not self._known(device_id):
            return self._drop("unknown_device")
        try:
            document = decode(payload)
            if parts[2] == "status" and len(parts) == 3:
                return self._offer_state(device_id, document)
            if parts[2] != "telemetry" or len(parts) != 4:
                return self._drop("topic")
            self.offer(device_id, parts[3], document, "mqtt")
        except BadRequest as exc:
            log.debug("telemetry from %s on %s dropped: %s", device_id, topic, exc)
            self._drop("malformed")
        return None

    def _offer_state(self, device_id: str, document: dict[str, Any]) -> None:
        state = document.get("state")
        if state not in STATES:
            raise BadRequest("a status is online or offline")
        now = self._clock()
        at = document.get("time")
        if not isinstance(at, (int, float)) or isinstance(at, bool) or not 0 < at <= now:
            at = now  # the device's clock, when plausible: a retained status is an old one
        with self._lock:
            held = self._online.get(device_id)
            if held is None or at >= held[1]:
                self._online[device_id] = (str(state), float(at))

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending) + len(self._online)

    def flush(self) -> int:
        """Write what is held (run it off the event loop); how many documents. A failed
        write keeps nothing back: the next documents come within the device's interval.
        A document the database refuses costs only itself, and is counted."""
        with self._lock:
            pending, self._pending = self._pending, {}
            online, self._online = self._online, {}
        if online:
            self.store.set_online(online)
        samples = sorted(pending.values(), key=lambda s: s.at)
        written = self.store.write(samples)
        if written < len(samples):
            self._drop("refused", len(samples) - written)
        return written


_Checked = tuple[dict[str, Any], tuple[int | None, float | None]]


def _checked(kind: str, document: dict[str, Any]) -> _Checked:
    """A document's columns, its ``seq`` and its ``time``, every field checked.

    Raises:
        BadRequest: the document is not what its kind says.
    """
    return columns(kind, document), stamp(document)
