"""What the device says about itself: the periodic telemetry of an agent (status,
decisions, latency) and the state of its offload link, read from the agent's public
views (its stats' snapshot, the models loaded, the device's state). The telemetry
sender (:mod:`edge_agent.telemetry`) and the service's status both use them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_agent.agent import Agent

__all__ = ["agent_reports", "offload_report"]


def offload_report(agent: Agent) -> dict[str, Any] | None:
    """The state of an agent's offload link (``None`` without one): the breaker's
    state and how often it opened, the exit guard's refusals by reason, the link's
    round trip and bandwidth as estimated and the bytes it carried (in all, and per
    model with the offloads answered), how many models the cloud lists, and (for
    transports that count them) responses that matched no request."""
    offload = agent.offload
    if offload is None:
        return None
    report: dict[str, Any] = {
        "transport": offload.transport.name,
        "breaker": offload.breaker.state,
        "breaker_opened": offload.breaker.opened,
        "guard_refusals": dict(offload.guard.refusals),
    }
    link = offload.costs.link.estimate(0)
    report["link"] = {
        "rtt_ms": None if link is None else round(link.rtt_ms, 3),
        "bandwidth_mbit_s": None if link is None else link.to_dict()["bandwidth_mbit_s"],
        "bytes_sent": offload.costs.sent,
        "bytes_received": offload.costs.received,
    }
    report["traffic"] = offload.traffic_report()
    index = offload.catalog.index()
    report["cloud_models"] = None if index is None else len(index)
    unmatched = getattr(offload.transport, "unmatched", None)
    if isinstance(unmatched, int):
        report["unmatched_responses"] = unmatched
    return report


def agent_reports(agent: Agent, streams: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The periodic telemetry of an agent, by kind: status, decisions, latency, and
    ``streams`` (frames in, out, dropped, skipped; latencies) when it runs any."""
    state = agent.device_state()
    stats = agent.stats.snapshot()
    decisions = [
        {"action": action, "reason": reason, "count": count}
        for (action, reason), count in sorted(stats["decisions"].items())
    ]
    status: dict[str, Any] = {
        "profile": agent.profile.id,
        "power_mode": agent.power_mode,
        "models": agent.loaded(),
        "temperatures": dict(state.temperatures),
        "throttled": state.throttled,
        "critical": state.critical,
        "cpu_load": state.cpu_load,
    }
    offload = offload_report(agent)
    if offload is not None:  # bytes per model are /metrics' (the gateway keeps the link's)
        status["offload"] = {k: v for k, v in offload.items() if k != "traffic"}
    return {
        "status": status,
        "decisions": {
            "decisions": decisions,
            "degraded": stats["degraded"],
            "cached_answers": stats["cached_answers"],
        },
        "latency": {"by_answerer": stats["latency"]},
        **({"streams": {"streams": streams}} if streams else {}),
    }
