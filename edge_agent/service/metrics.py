"""Prometheus metrics of the agent, served at ``/metrics`` on the local API.

Counters and histograms are updated as requests are answered; the device's
state (temperatures, power mode, thermal level, model versions, the telemetry
queue, OTA outcomes) is read when Prometheus scrapes, from a snapshot the
daemon provides, so nothing polls in the background for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "ServiceMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

Snapshot = Callable[[], dict[str, Any]]


class _StateCollector(Collector):
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        state = self.snapshot()
        temperatures = GaugeMetricFamily(
            "edge_agent_temperature_celsius", "Thermal zone temperatures.", labels=["zone"]
        )
        for zone, value in state.get("temperatures", {}).items():
            if value is not None:
                temperatures.add_metric([zone], value)
        yield temperatures
        mode = GaugeMetricFamily(
            "edge_agent_power_mode", "1 for the power mode in force.", labels=["mode"]
        )
        mode.add_metric([state.get("power_mode", "")], 1)
        yield mode
        level = GaugeMetricFamily(
            "edge_agent_thermal_level",
            "1 for the thermal level (normal, hot, critical).",
            labels=["level"],
        )
        level.add_metric([state.get("thermal_level", "normal")], 1)
        yield level
        models = GaugeMetricFamily(
            "edge_agent_model_loaded",
            "1 for each model loaded on the device, by version and variant.",
            labels=["model", "version", "variant"],
        )
        for name, info in state.get("models", {}).items():
            models.add_metric([name, str(info["version"]), info["variant"]], 1)
        yield models
        inflight = GaugeMetricFamily("edge_agent_requests_in_flight", "Requests being answered.")
        inflight.add_metric([], state.get("inflight", 0))
        yield inflight
        queue = state.get("queue")
        if queue is not None:
            waiting = GaugeMetricFamily(
                "edge_agent_telemetry_queue_messages", "Telemetry messages waiting on disk."
            )
            waiting.add_metric([], queue["waiting"])
            yield waiting
            dropped = CounterMetricFamily(
                "edge_agent_telemetry_dropped", "Telemetry messages dropped from a full queue."
            )
            dropped.add_metric([], queue["dropped"])
            yield dropped
        ota = CounterMetricFamily(
            "edge_agent_ota_updates", "Update outcomes reported.", labels=["status"]
        )
        for status, count in state.get("ota", {}).items():
            ota.add_metric([status], count)
        yield ota


class ServiceMetrics:
    def __init__(self, snapshot: Snapshot = dict) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "edge_agent_requests",
            "Requests by model, decision (action) and reason.",
            ["model", "action", "reason"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "edge_agent_request_seconds",
            "Request latency through the local API, by where it was answered.",
            ["where"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_StateCollector(snapshot))

    def request(
        self, model: str, action: str, reason: str, where: str | None, seconds: float
    ) -> None:
        self.requests.labels(model, action, reason).inc()
        if where is not None:
            self.seconds.labels(where).observe(seconds)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
