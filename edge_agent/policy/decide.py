"""The offload decision: a pure function of a request's facts and the rules.

No I/O and no clock: every input (the request's label and the detectors'
findings, where the model can run, latency estimates, the remaining deadline,
device and link state) is a value in :class:`RequestFacts`. The result is an
:class:`Action` with a machine-readable reason and a sentence for people.

The decision runs in two steps for models that escalate: before the local
run (``local_confidence`` unknown) and after it, with the local model's top
probability; below the threshold the request goes to the cloud's heavier model
(edge-cloud joint inference).

Order of precedence, strongest first:

1. what may leave the device (the effective label: the stricter of the
   request's label and its findings): ``local`` data never goes to the cloud;
2. where the model can run at all (placement; the device lacks the model or
   the memory for it; above the critical temperature no local work);
3. why the cloud would be better: low confidence, throttling, CPU load, a
   local estimate that misses the deadline (one run's moving average for each
   request ahead of this one, and one for itself), a preference;
4. whether the cloud is reachable (offline, circuit breaker open): if not, a
   request that wanted the cloud runs locally, marked degraded. A device with
   no gateway at all keeps its work local without calling it degraded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from edge_agent.policy.reasons import Reason
from edge_agent.policy.rules import PolicyRules

__all__ = ["Action", "Decision", "RequestFacts", "decide", "expected_local_ms"]


class Action(str, Enum):
    LOCAL = "LOCAL"
    OFFLOAD = "OFFLOAD"
    OFFLOAD_REDACTED = "OFFLOAD_REDACTED"
    LOCAL_DEGRADED = "LOCAL_DEGRADED"
    REJECT = "REJECT"


@dataclass(frozen=True)
class RequestFacts:
    model: str
    label: str | None = None
    findings: frozenset[str] = frozenset()  # "faces", "pii"
    on_device: bool = True  # the device has a variant it can run
    fits_memory: bool = True
    local_ms: float | None = None  # expected local time of one run (moving average)
    local_queue: int = 0  # local requests already running on the model, ahead of this one
    remote_ms: float | None = None  # expected round trip plus remote compute
    deadline_ms: float | None = None  # time left
    throttled: bool = False
    critical: bool = False
    cpu_load: float | None = None  # 0..1 (load average per core)
    gateway: bool = True  # a gateway is configured at all (False: a local-only device)
    online: bool = True
    breaker_open: bool = False
    local_confidence: float | None = None  # after the local run, for escalation


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    message: str
    model: str  # the model that answers (the escalation target when escalating)
    label: str  # the effective label
    escalate_below: float | None = None  # LOCAL: decide again below this confidence
    escalate_to: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def leaves_device(self) -> bool:
        return self.action in (Action.OFFLOAD, Action.OFFLOAD_REDACTED)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "decision": self.action.value,
            "reason": self.reason,
            "explanation": self.message,
            "model": self.model,
            "label": self.label,
        }
        if self.escalate_to is not None:
            out["escalate_to"] = self.escalate_to
            out["escalate_below"] = self.escalate_below
        if self.details:
            out["details"] = self.details
        return out


def _fits(estimate: float | None, facts: RequestFacts, rules: PolicyRules) -> bool | None:
    """Whether an estimate fits the deadline (``None``: no estimate or no deadline)."""
    if estimate is None or facts.deadline_ms is None:
        return None
    return estimate + rules.deadline_margin_ms <= facts.deadline_ms


def expected_local_ms(facts: RequestFacts) -> float | None:
    """The local time this request can expect: its own run plus the queue ahead of it."""
    if facts.local_ms is None:
        return None
    return facts.local_ms * (1 + max(facts.local_queue, 0))


def _missing_estimates(facts: RequestFacts, local_ok: bool) -> str:
    """What a deadline could not be weighed against, as the end of a sentence: the
    places that could answer but have no latency estimate yet."""
    if facts.deadline_ms is None:
        return ""
    missing = [
        where
        for where, possible, value in (
            ("the device", local_ok, facts.local_ms),
            ("the cloud", facts.gateway, facts.remote_ms),
        )
        if possible and value is None
    ]
    if not missing:
        return ""
    return (
        f"; no latency estimate yet for {' or '.join(missing)} to weigh against the "
        f"{facts.deadline_ms:.1f} ms deadline"
    )


def decide(facts: RequestFacts, rules: PolicyRules) -> Decision:
    """Where this request runs, and why."""
    rule = rules.rule(facts.model)
    label = rules.effective_label(facts.label, set(facts.findings))
    leave = rules.leave_mode(label)
    found = f" ({', '.join(sorted(facts.findings))} found)" if facts.findings else ""
    local_blocked = facts.critical and not rules.local_when_critical
    local_ok = (
        rule.placement != "cloud" and facts.on_device and facts.fits_memory and not local_blocked
    )
    local_ms = expected_local_ms(facts)

    def make(action: Action, reason: str, message: str, model: str | None = None) -> Decision:
        escalate = action == Action.LOCAL and facts.local_confidence is None and rule.escalate_to
        return Decision(
            action=action,
            reason=reason,
            message=message + _missing_estimates(facts, local_ok),
            model=model or facts.model,
            label=label,
            escalate_below=rule.escalate_below if escalate else None,
            escalate_to=rule.escalate_to if escalate else None,
        )

    # 1-3: does the cloud serve this request better, and why?
    target = facts.model
    cloud_reason: str | None = None
    cloud_message = ""
    soft = False  # a preference rather than a necessity
    if facts.local_confidence is not None:
        if rule.escalate_to is None or rule.escalate_below is None:
            return make(
                Action.LOCAL, Reason.NO_ESCALATION, "the model has no cloud model to escalate to"
            )
        if facts.local_confidence >= rule.escalate_below:
            return make(
                Action.LOCAL,
                Reason.CONFIDENT,
                f"the local answer's confidence {facts.local_confidence:.2f} meets the "
                f"threshold {rule.escalate_below:.2f}",
            )
        target = rule.escalate_to
        cloud_reason, soft = Reason.LOW_CONFIDENCE, True
        cloud_message = (
            f"the local answer's confidence {facts.local_confidence:.2f} is below "
            f"{rule.escalate_below:.2f}: the cloud's {target} answers"
        )
    elif rule.placement == "device":
        if local_ok:
            return make(Action.LOCAL, Reason.DEVICE_ONLY, f"{facts.model} runs on the device only")
        return make(
            Action.REJECT,
            Reason.DEVICE_ONLY_UNAVAILABLE,
            f"{facts.model} may run on the device only, and the device cannot run it now"
            + (" (above its critical temperature)" if local_blocked else ""),
        )
    elif rule.placement == "cloud":
        cloud_reason, cloud_message = Reason.CLOUD_ONLY, f"{facts.model} runs in the cloud only"
    elif not facts.on_device:
        cloud_reason, cloud_message = (
            Reason.NOT_ON_DEVICE,
            f"the device does not have {facts.model}",
        )
    elif not facts.fits_memory:
        cloud_reason = Reason.EXCEEDS_MEMORY_BUDGET
        cloud_message = f"{facts.model} does not fit the device's memory budget"
    elif local_blocked:
        cloud_reason = Reason.THERMAL_CRITICAL
        cloud_message = "the device is above its critical temperature: no local work"
    elif facts.throttled and rules.offload_when_throttled:
        cloud_reason, soft = Reason.THERMAL_THROTTLED, True
        cloud_message = "the device is throttling for heat"
    elif facts.cpu_load is not None and facts.cpu_load > rules.max_cpu_load:
        cloud_reason, soft = Reason.CPU_OVERLOADED, True
        cloud_message = f"the CPU load {facts.cpu_load:.2f} is above {rules.max_cpu_load:.2f}"
    elif _fits(local_ms, facts, rules) is False and _fits(facts.remote_ms, facts, rules):
        queue = (
            f" ({facts.local_queue} ahead, ~{facts.local_ms:.1f} ms each)"
            if facts.local_queue > 0
            else ""
        )
        cloud_reason = Reason.DEADLINE_LOCAL_TOO_SLOW
        cloud_message = (
            f"locally ~{local_ms:.1f} ms{queue} would miss the {facts.deadline_ms:.1f} ms "
            f"deadline; the cloud takes ~{facts.remote_ms:.1f} ms"
        )
    elif rules.prefer == "cloud" and _fits(facts.remote_ms, facts, rules) is not False:
        cloud_reason, soft = Reason.PREFER_CLOUD, True
        cloud_message = "the policy prefers the cloud"

    if cloud_reason is None:
        return make(
            Action.LOCAL, Reason.PREFER_LOCAL, "the device answers (the policy prefers local)"
        )

    # 1: may it leave at all?
    if leave == "local":
        if facts.local_confidence is not None:
            return make(
                Action.LOCAL,
                Reason.STAYS_ON_DEVICE,
                f"the request is '{label}'{found}: it may not leave the device, so the local "
                "answer stands",
            )
        if local_ok:
            return make(
                Action.LOCAL,
                Reason.STAYS_ON_DEVICE,
                f"{cloud_message}, but the request is '{label}'{found} and may not leave the "
                "device",
            )
        return make(
            Action.REJECT,
            Reason.MAY_NOT_LEAVE,
            f"{cloud_message}, but the request is '{label}'{found} and may not leave the device",
        )
    if not facts.gateway:
        if soft and (local_ok or facts.local_confidence is not None):
            return make(
                Action.LOCAL, Reason.NO_GATEWAY, f"{cloud_message}, but this device has no gateway"
            )
        return make(
            Action.REJECT,
            Reason.NO_GATEWAY,
            f"{cloud_message}, but this device has no gateway to send it to",
        )
    # a preference for the cloud yields to a deadline the cloud would miss
    if (
        soft
        and _fits(facts.remote_ms, facts, rules) is False
        and (local_ok or facts.local_confidence is not None)
    ):
        return make(
            Action.LOCAL,
            Reason.DEADLINE_REMOTE_TOO_SLOW,
            f"{cloud_message}, but the cloud's ~{facts.remote_ms:.1f} ms would miss the "
            f"{facts.deadline_ms:.1f} ms deadline",
        )
    # 4: is the cloud reachable?
    if not facts.online or facts.breaker_open:
        why = "the device is offline" if not facts.online else "the circuit breaker is open"
        reason = Reason.OFFLINE if not facts.online else Reason.BREAKER_OPEN
        if local_ok or facts.local_confidence is not None:
            return make(
                Action.LOCAL_DEGRADED,
                reason,
                f"{cloud_message}, but {why}: the local model answers, marked degraded",
            )
        return make(
            Action.REJECT,
            Reason.CLOUD_UNREACHABLE,
            f"{cloud_message}, but {why} and it cannot run here",
        )
    if leave == "redact":
        return make(
            Action.OFFLOAD_REDACTED,
            cloud_reason,
            f"{cloud_message}; the request is '{label}'{found}, so only a redacted copy leaves",
            target,
        )
    return make(Action.OFFLOAD, cloud_reason, cloud_message, target)
