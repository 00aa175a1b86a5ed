"""Every reason a decision can give, in one place: the machine-readable half of a
decision (the other half is a sentence for people). They are plain strings on
the wire, in logs, metrics (``edge_agent_requests_total{reason=...}``) and
telemetry; code compares them through these names, never as literals.
"""

from __future__ import annotations

from typing import Final

__all__ = ["Reason"]


class Reason:
    """The reasons, grouped by the action they come with."""

    # LOCAL
    PREFER_LOCAL: Final = "prefer_local"  # nothing speaks for the cloud
    DEVICE_ONLY: Final = "device_only"  # the model's placement is the device
    CONFIDENT: Final = "confident"  # the local answer meets the escalation threshold
    NO_ESCALATION: Final = "no_escalation"  # the model has no cloud model to escalate to
    STAYS_ON_DEVICE: Final = "stays_on_device"  # the cloud would be better; the label forbids it
    NO_GATEWAY: Final = "no_gateway"  # the cloud would be better; there is none (or REJECT)
    # the cloud would miss the deadline (LOCAL_DEGRADED where the cloud was a necessity)
    DEADLINE_REMOTE_TOO_SLOW: Final = "deadline_remote_too_slow"
    NOT_IN_CLOUD: Final = "not_in_cloud"  # the cloud would be better; it lacks the model
    # OFFLOAD / OFFLOAD_REDACTED: why the cloud answers
    CLOUD_ONLY: Final = "cloud_only"
    NOT_ON_DEVICE: Final = "not_on_device"
    EXCEEDS_MEMORY_BUDGET: Final = "exceeds_memory_budget"
    THERMAL_CRITICAL: Final = "thermal_critical"
    THERMAL_THROTTLED: Final = "thermal_throttled"
    CPU_OVERLOADED: Final = "cpu_overloaded"
    DEADLINE_LOCAL_TOO_SLOW: Final = "deadline_local_too_slow"
    PREFER_CLOUD: Final = "prefer_cloud"
    LOW_CONFIDENCE: Final = "low_confidence"  # the light model was unsure: the heavy one answers
    # LOCAL_DEGRADED: the cloud was wanted and could not answer
    OFFLINE: Final = "offline"
    BREAKER_OPEN: Final = "breaker_open"
    OFFLOAD_FAILED: Final = "offload_failed"  # the agent's: the offload was tried and failed
    # REJECT
    DEVICE_ONLY_UNAVAILABLE: Final = "device_only_unavailable"
    MAY_NOT_LEAVE: Final = "may_not_leave"
    CLOUD_UNREACHABLE: Final = "cloud_unreachable"  # a stand-in may still answer, degraded
