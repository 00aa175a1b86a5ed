"""Prometheus metrics of one gateway (its own registry: several gateways, or
tests, can live in one process).

Every label value comes from a bounded set, never from what a client sends as
it is: models are the loaded ones (anything else is ``unknown``), devices the
registered ones (a request is counted by device only once authenticated),
and the other labels (protocol, status, reason, group) from fixed lists or
the operator's configuration.

Who reads what: a series with a label in :data:`FLEET_LABELS` (a device, a group)
lists the fleet, so it is rendered for operators only (``render(operator=True)``);
everyone else gets the rest, whatever series are added later.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

__all__ = ["CONTENT_TYPE", "FLEET_LABELS", "GatewayMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
FLEET_LABELS = frozenset({"device", "group"})  # series with one of them: operators only

_LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class GatewayMetrics:
    """Every series of one gateway, registered by concern (the exposition lists them in
    this order)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._add_request_metrics(self.registry)
        self._add_batching_metrics(self.registry)
        self._add_fleet_metrics(self.registry)
        self._add_connection_metrics(self.registry)
        self._add_backend_metrics(self.registry)

    def _add_request_metrics(self, r: CollectorRegistry) -> None:
        """Requests: by model, protocol and outcome, by device, and their time."""
        self.requests = Counter(
            "gateway_requests",
            "Inference requests by model, protocol and outcome (ok or the error kind).",
            ["model", "protocol", "status"],
            registry=r,
        )
        self.failures = Counter(
            "gateway_request_failures",
            "Failed inference requests by model, protocol and error kind.",
            ["model", "protocol", "status"],
            registry=r,
        )
        self.device_requests = Counter(
            "gateway_device_requests",
            "Inference requests by device and group.",
            ["device", "group"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "gateway_request_seconds",
            "Time from a request's arrival at the data plane to its response.",
            ["model", "protocol"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def _add_batching_metrics(self, r: CollectorRegistry) -> None:
        """The batches: their queue time, compute time and rows; the models loaded."""
        self.queue_seconds = Histogram(
            "gateway_queue_seconds",
            "Time a request waited in its model's batching queue.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.compute_seconds = Histogram(
            "gateway_compute_seconds",
            "Time the runtime took for one run (one batch when batching).",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "gateway_batch_size",
            "Rows per runtime run.",
            ["model"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.models_loaded = Gauge(
            "gateway_model_loaded",
            "1 for each model version loaded and ready.",
            ["model", "version", "variant"],
            registry=r,
        )

    def _add_fleet_metrics(self, r: CollectorRegistry) -> None:
        """The fleet: MQTT requests dropped, announcements, telemetry, update reports
        refused, dashboard sign-ins."""
        self.mqtt_dropped = Counter(
            "gateway_mqtt_dropped",
            "MQTT requests dropped unanswered (no valid token, response topic or correlation).",
            ["reason"],
            registry=r,
        )
        self.mqtt_announcements = Counter(
            "gateway_mqtt_announcements",
            "Rollout announcements published, by group.",
            ["group"],
            registry=r,
        )

        self.telemetry_messages = Counter(
            "gateway_telemetry_messages",
            "Telemetry documents taken from devices, by how they came (mqtt, http).",
            ["source"],
            registry=r,
        )
        self.telemetry_dropped = Counter(
            "gateway_telemetry_dropped",
            "Telemetry messages dropped: unknown_device, malformed, topic.",
            ["reason"],
            registry=r,
        )
        self.ota_reports_refused = Counter(
            "gateway_ota_reports_refused",
            "Update reports and check statuses refused, not kept: not_offered (a version "
            "the device's group was never offered), rate_limited.",
            ["reason"],
            registry=r,
        )
        self.dashboard_sign_ins = Counter(
            "gateway_dashboard_sign_ins",
            "Dashboard sign-ins, by outcome (ok, refused).",
            ["outcome"],
            registry=r,
        )

    def _add_connection_metrics(self, r: CollectorRegistry) -> None:
        """Clients' connections: requests whose client went away, the REST connections
        open and closed, the listener's accept failures."""
        self.client_disconnects = Counter(
            "gateway_client_disconnects",
            "Requests whose client went away before their body was in.",
            ["protocol"],
            registry=r,
        )
        self.http_connections = Gauge(
            "gateway_http_connections", "Open REST connections.", registry=r
        )
        self.http_connections_closed = Counter(
            "gateway_http_connections_closed",
            "REST connections closed by the gateway, by reason (idle, header_timeout, "
            "body_timeout, header_too_large, malformed, evicted, refused, stopping).",
            ["reason"],
            registry=r,
        )
        self.accept_exhausted = Counter(
            "gateway_accept_exhausted",
            "Times the REST listener could not accept a connection for lack of descriptors "
            "or memory (it then pauses accepting for a second).",
            registry=r,
        )

    def _add_backend_metrics(self, r: CollectorRegistry) -> None:
        """What serves behind the front ends: the state database, the remote engines."""
        self.state_queries = Gauge(
            "gateway_state_queries",
            "Statements this gateway has run on the state database since it started.",
            registry=r,
        )
        self.engine_up = Gauge(
            "gateway_engine_up",
            "Whether each remote engine ([[backends]]) answers its readiness check.",
            ["engine"],
            registry=r,
        )

    def render(self, *, operator: bool) -> bytes:
        """The exposition: every series for an operator, else those that name no device
        and no group (a device must not learn the fleet from them)."""
        if operator:
            return bytes(generate_latest(self.registry))
        return bytes(generate_latest(_FleetNeutral(self.registry)))


class _FleetNeutral:
    """A registry's families but those with a series labelled by device or group."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            if not any(FLEET_LABELS.intersection(sample.labels) for sample in family.samples):
                yield family
