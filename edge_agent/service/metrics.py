"""Prometheus metrics of the agent, served at ``/metrics`` on the local API.

Counters and histograms are updated as requests are answered; the device's
state (temperatures, power mode, thermal level, model versions, the telemetry
queue, OTA outcomes, MQTT payloads dropped, the offload breaker's state, the
exit guard's refusals, unmatched offload responses) is read when Prometheus
scrapes, from a snapshot the daemon provides, so nothing polls in the
background for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from edge_agent.streams.source import STATES

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
        yield _one(
            GaugeMetricFamily,
            "edge_agent_requests_in_flight",
            "Requests being answered.",
            state.get("inflight", 0),
        )
        queue = state.get("queue")
        if queue is not None:
            yield _one(
                GaugeMetricFamily,
                "edge_agent_telemetry_queue_messages",
                "Telemetry messages waiting on disk.",
                queue["waiting"],
            )
            yield _one(
                CounterMetricFamily,
                "edge_agent_telemetry_dropped",
                "Telemetry messages dropped from a full queue.",
                queue["dropped"],
            )
        yield _by_label(
            "edge_agent_ota_updates", "Update outcomes reported.", "status", state.get("ota", {})
        )
        yield from _link_metrics(state)
        if state.get("streams"):
            yield from _stream_metrics(state["streams"])


def _one(
    kind: type[GaugeMetricFamily | CounterMetricFamily],
    name: str,
    documentation: str,
    value: float,
) -> Metric:
    """A gauge or counter with one sample."""
    family = kind(name, documentation)
    family.add_metric([], value)
    return family


def _by_label(name: str, documentation: str, label: str, counts: dict[str, int]) -> Metric:
    """A counter with one sample per value of ``label``."""
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value, count in counts.items():
        family.add_metric([value], count)
    return family


def _stream_metrics(streams: dict[str, Any]) -> Iterator[Metric]:
    """Per stream: frames by outcome, and the recent end-to-end and stage latencies."""
    frames = CounterMetricFamily(
        "edge_agent_stream_frames",
        "Stream frames by outcome: in (decoded), out (answered), dropped (the newest won), "
        "skipped (a key frame's result carried over), failed, degraded, unsent (the sink "
        "failed).",
        labels=["stream", "outcome"],
    )
    latency = GaugeMetricFamily(
        "edge_agent_stream_latency_ms",
        "Recent stream latencies (capture to result, and each stage), by quantile.",
        labels=["stream", "stage", "quantile"],
    )
    state = GaugeMetricFamily(
        "edge_agent_stream_state",
        "The stream's source: 1 for the state it is in (starting, running, reconnecting, "
        "ended, failed).",
        labels=["stream", "state"],
    )
    reopened = CounterMetricFamily(
        "edge_agent_stream_reopened", "Times a live source was opened again.", labels=["stream"]
    )
    unsent = CounterMetricFamily(
        "edge_agent_stream_sink_dropped",
        "Results the sink could not send (MQTT while the link is down, an event listener "
        "too slow).",
        labels=["stream"],
    )
    for name, stream in sorted(streams.items()):
        for outcome, count in stream["frames"].items():
            frames.add_metric([name, outcome], count)
        for stage, summary in stream["latency_ms"].items():
            for quantile, key in (("0.5", "p50_ms"), ("0.99", "p99_ms")):
                latency.add_metric([name, stage, quantile], summary[key])
        for value in STATES:
            state.add_metric([name, value], 1.0 if stream.get("state") == value else 0.0)
        reopened.add_metric([name], stream.get("reopened", 0))
        unsent.add_metric([name], stream.get("sink_dropped", 0))
    yield from (frames, latency, state, reopened, unsent)


def _link_metrics(state: dict[str, Any]) -> Iterator[Metric]:
    """The MQTT connection's and the offload link's counters and the breaker's state."""
    if "mqtt_dropped" in state:
        yield _by_label(
            "edge_agent_mqtt_dropped",
            "MQTT payloads dropped as unparsable, by subscription (unexpected: no handler).",
            "subscription",
            state["mqtt_dropped"],
        )
    offload = state.get("offload")
    if offload is None:
        return
    breaker = GaugeMetricFamily(
        "edge_agent_offload_breaker_state",
        "1 for the offload circuit breaker's state (closed, open, half_open).",
        labels=["state"],
    )
    for name in ("closed", "open", "half_open"):
        breaker.add_metric([name], 1 if offload["breaker"] == name else 0)
    yield breaker
    yield _one(
        CounterMetricFamily,
        "edge_agent_offload_breaker_opened",
        "Times the offload circuit breaker opened.",
        offload["breaker_opened"],
    )
    yield _by_label(
        "edge_agent_offload_guard_refusals",
        "Requests the exit guard kept on the device, by reason.",
        "reason",
        offload["guard_refusals"],
    )
    yield from _traffic_metrics(offload)
    if "unmatched_responses" in offload:
        yield _one(
            CounterMetricFamily,
            "edge_agent_offload_unmatched_responses",
            "Offload responses that matched no request waiting (late, or not ours).",
            offload["unmatched_responses"],
        )


def _traffic_metrics(offload: dict[str, Any]) -> Iterator[Metric]:
    """The bytes the offload link carried, per model, and its estimated round trip and
    bandwidth."""
    transport = offload["transport"]
    for direction in ("sent", "received"):
        family = CounterMetricFamily(
            f"edge_agent_offload_bytes_{direction}",
            f"Bytes {direction} on the wire by answered offloads, by transport and model.",
            labels=["transport", "model"],
        )
        for model, counts in sorted(offload["traffic"].items()):
            family.add_metric([transport, model], counts[direction])
        yield family
    link = offload["link"]
    for key, name, what, scale in (
        ("rtt_ms", "edge_agent_offload_link_rtt_seconds", "round trip", 1e-3),
        (
            "bandwidth_mbit_s",
            "edge_agent_offload_link_bandwidth_bytes_per_second",
            "bandwidth",
            1e6 / 8,
        ),
    ):
        if link[key] is not None:
            yield _one(
                GaugeMetricFamily,
                name,
                f"The offload link's {what}, as estimated from the agent's own offloads.",
                link[key] * scale,
            )


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
