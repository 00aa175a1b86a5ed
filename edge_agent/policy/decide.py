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
4. whether the cloud can answer: it has the model (as far as the device has
   learnt), its estimate (the link's round trip, the request's bytes over the
   link's bandwidth, the gateway's time) meets the deadline, it is reachable
   (offline, circuit breaker open). If not, a request that wanted the cloud runs
   locally (marked degraded when the cloud was a necessity), up front rather than
   after a timeout, or is refused with the reason. A device with no gateway at all
   keeps its work local without calling it degraded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from edge_agent.policy.reasons import Reason
from edge_agent.policy.rules import ModelRule, PolicyRules

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
    remote_ms: float | None = None  # expected round trip, transfer and remote compute
    remote_parts: str = ""  # remote_ms in its parts, for the message
    deadline_ms: float | None = None  # time left
    throttled: bool = False
    critical: bool = False
    cpu_load: float | None = None  # 0..1 (load average per core)
    gateway: bool = True  # a gateway is configured at all (False: a local-only device)
    online: bool = True
    breaker_open: bool = False
    local_confidence: float | None = None  # after the local run, for escalation
    cloud_lacks: frozenset[str] = frozenset()  # models the gateway is known not to have


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


@dataclass(frozen=True)
class _Request:
    """One request as the rules see it: its facts, the rules, and what follows from them."""

    facts: RequestFacts
    rules: PolicyRules
    rule: ModelRule
    label: str  # the effective label
    leave: str  # what the label lets leave: free, redact or local
    found: str  # the findings, as the end of a phrase: " (faces found)"
    local_blocked: bool  # above the critical temperature, with no local work allowed then
    local_ok: bool  # the device can run the model now
    local_ms: float | None  # the local time this request can expect

    @classmethod
    def of(cls, facts: RequestFacts, rules: PolicyRules) -> _Request:
        rule = rules.rule(facts.model)
        label = rules.effective_label(facts.label, set(facts.findings))
        local_blocked = facts.critical and not rules.local_when_critical
        return cls(
            facts=facts,
            rules=rules,
            rule=rule,
            label=label,
            leave=rules.leave_mode(label),
            found=f" ({', '.join(sorted(facts.findings))} found)" if facts.findings else "",
            local_blocked=local_blocked,
            local_ok=(
                rule.placement != "cloud"
                and facts.on_device
                and facts.fits_memory
                and not local_blocked
            ),
            local_ms=expected_local_ms(facts),
        )

    @property
    def reachable(self) -> bool:
        """Whether the cloud can be reached (online, breaker closed): where it cannot,
        that is what a degraded answer says, whatever else it lacks."""
        return self.facts.online and not self.facts.breaker_open

    @property
    def answers_locally(self) -> bool:
        """Whether a local answer exists (escalating) or can be made: the stand-in
        when the cloud is not taken."""
        return self.local_ok or self.facts.local_confidence is not None

    def fits(self, estimate: float | None) -> bool | None:
        """Whether an estimate fits the deadline (``None``: no estimate or no deadline)."""
        if estimate is None or self.facts.deadline_ms is None:
            return None
        return estimate + self.rules.deadline_margin_ms <= self.facts.deadline_ms

    def answer(
        self, action: Action, reason: str, message: str, model: str | None = None
    ) -> Decision:
        """The decision, armed to escalate when it runs locally before the local answer
        is known and the model has a cloud model to escalate to."""
        escalate = (
            action == Action.LOCAL and self.facts.local_confidence is None and self.rule.escalate_to
        )
        weighed = action in (Action.LOCAL, Action.OFFLOAD, Action.OFFLOAD_REDACTED)
        missing = _missing_estimates(self.facts, self.local_ok) if weighed else ""
        return Decision(
            action=action,
            reason=reason,
            message=message + (missing if reason != Reason.NOT_IN_CLOUD else ""),
            model=model or self.facts.model,
            label=self.label,
            escalate_below=self.rule.escalate_below if escalate else None,
            escalate_to=self.rule.escalate_to if escalate else None,
        )


@dataclass(frozen=True)
class _CloudCase:
    """Why the cloud would serve a request better than the device."""

    reason: str
    message: str
    # a preference rather than a necessity: it yields to a deadline the cloud would miss,
    # and to a device with no gateway
    soft: bool = False
    model: str | None = None  # the model that answers in the cloud (default: the one asked)


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
    """Where this request runs, and why: the first rule that speaks, in the order of
    precedence of this module's docstring.

    Why the cloud would be better is asked first (steps 2-3); what may leave
    (step 1) and whether the cloud is reachable (step 4) then decide whether
    it goes there: a request nothing sends to the cloud needs neither.
    """
    request = _Request.of(facts, rules)
    case: Decision | _CloudCase | None
    if facts.local_confidence is not None:
        case = _escalation(request, facts.local_confidence)
    elif request.rule.placement == "device":
        return _device_only(request)
    else:
        case = next(filter(None, (why(request) for why in _CLOUD_RULES)), None)
    if isinstance(case, Decision):
        return case
    if case is None:
        return request.answer(
            Action.LOCAL, Reason.PREFER_LOCAL, "the device answers (the policy prefers local)"
        )
    for gate in _GATES:
        decision = gate(request, case)
        if decision is not None:
            return decision
    return _offload(request, case)


# -- steps 2-3: where the model can run, and why the cloud would be better ------------------


def _escalation(request: _Request, confidence: float) -> Decision | _CloudCase:
    """After the local run (``confidence``: the local answer's top probability): an
    answer below the model's threshold goes to the cloud's heavier model (joint
    inference); one that meets it, or of a model with none, stands."""
    rule = request.rule
    if rule.escalate_to is None or rule.escalate_below is None:
        return request.answer(
            Action.LOCAL, Reason.NO_ESCALATION, "the model has no cloud model to escalate to"
        )
    if confidence >= rule.escalate_below:
        return request.answer(
            Action.LOCAL,
            Reason.CONFIDENT,
            f"the local answer's confidence {confidence:.2f} meets the "
            f"threshold {rule.escalate_below:.2f}",
        )
    return _CloudCase(
        Reason.LOW_CONFIDENCE,
        f"the local answer's confidence {confidence:.2f} is below "
        f"{rule.escalate_below:.2f}: the cloud's {rule.escalate_to} answers",
        soft=True,
        model=rule.escalate_to,
    )


def _device_only(request: _Request) -> Decision:
    """A model placed on the device runs there or nowhere: it never leaves, whatever
    the device's state."""
    model = request.facts.model
    if request.local_ok:
        return request.answer(Action.LOCAL, Reason.DEVICE_ONLY, f"{model} runs on the device only")
    if not request.facts.on_device:
        why = f"{model} may run on the device only, and it is not installed here"
    else:
        why = f"{model} may run on the device only, and the device cannot run it now" + (
            " (above its critical temperature)" if request.local_blocked else ""
        )
    return request.answer(Action.REJECT, Reason.DEVICE_ONLY_UNAVAILABLE, why)


def _placed_in_the_cloud(request: _Request) -> _CloudCase | None:
    """A model placed in the cloud runs there."""
    if request.rule.placement != "cloud":
        return None
    return _CloudCase(Reason.CLOUD_ONLY, f"{request.facts.model} runs in the cloud only")


def _not_on_the_device(request: _Request) -> _CloudCase | None:
    """The device has no variant of the model it can run."""
    if request.facts.on_device:
        return None
    return _CloudCase(Reason.NOT_ON_DEVICE, f"the device does not have {request.facts.model}")


def _over_the_memory_budget(request: _Request) -> _CloudCase | None:
    """The model does not fit the memory the device profile allows."""
    if request.facts.fits_memory:
        return None
    return _CloudCase(
        Reason.EXCEEDS_MEMORY_BUDGET,
        f"{request.facts.model} does not fit the device's memory budget",
    )


def _above_critical_temperature(request: _Request) -> _CloudCase | None:
    """Above the critical temperature, no local work (unless the policy allows it)."""
    if not request.local_blocked:
        return None
    return _CloudCase(
        Reason.THERMAL_CRITICAL, "the device is above its critical temperature: no local work"
    )


def _throttling(request: _Request) -> _CloudCase | None:
    """A device throttling for heat sends away what may leave, where the policy says so."""
    if not (request.facts.throttled and request.rules.offload_when_throttled):
        return None
    return _CloudCase(Reason.THERMAL_THROTTLED, "the device is throttling for heat", soft=True)


def _cpu_overloaded(request: _Request) -> _CloudCase | None:
    """A CPU loaded past the policy's limit sends away what may leave."""
    load, limit = request.facts.cpu_load, request.rules.max_cpu_load
    if load is None or load <= limit:
        return None
    return _CloudCase(
        Reason.CPU_OVERLOADED, f"the CPU load {load:.2f} is above {limit:.2f}", soft=True
    )


def _too_slow_here(request: _Request) -> _CloudCase | None:
    """The local estimate (the queue ahead included) misses the deadline, and the
    cloud's fits it."""
    facts = request.facts
    if request.fits(request.local_ms) is not False or not request.fits(facts.remote_ms):
        return None
    queue = (
        f" ({facts.local_queue} ahead, ~{facts.local_ms:.1f} ms each)"
        if facts.local_queue > 0
        else ""
    )
    return _CloudCase(
        Reason.DEADLINE_LOCAL_TOO_SLOW,
        f"locally ~{request.local_ms:.1f} ms{queue} would miss the {facts.deadline_ms:.1f} ms "
        f"deadline; the cloud takes ~{facts.remote_ms:.1f} ms{_parts(facts)}",
    )


def _parts(facts: RequestFacts) -> str:
    return f" ({facts.remote_parts})" if facts.remote_parts else ""


def _cloud_preferred(request: _Request) -> _CloudCase | None:
    """The policy prefers the cloud, unless the cloud's estimate misses the deadline."""
    if request.rules.prefer != "cloud" or request.fits(request.facts.remote_ms) is False:
        return None
    return _CloudCase(Reason.PREFER_CLOUD, "the policy prefers the cloud", soft=True)


# before the local run, in order: the first that speaks is why the cloud would be better
_CLOUD_RULES: tuple[Callable[[_Request], _CloudCase | None], ...] = (
    _placed_in_the_cloud,
    _not_on_the_device,
    _over_the_memory_budget,
    _above_critical_temperature,
    _throttling,
    _cpu_overloaded,
    _too_slow_here,
    _cloud_preferred,
)


# -- steps 1 and 4: whether a request the cloud would serve better goes there ---------------


def _label_keeps_it_here(request: _Request, case: _CloudCase) -> Decision | None:
    """Data whose label says ``local`` never leaves: the local answer stands, or the
    device answers, or no one does."""
    if request.leave != "local":
        return None
    label, found = request.label, request.found
    if request.facts.local_confidence is not None:
        return request.answer(
            Action.LOCAL,
            Reason.STAYS_ON_DEVICE,
            f"the request is '{label}'{found}: it may not leave the device, so the local "
            "answer stands",
        )
    if request.local_ok:
        return request.answer(
            Action.LOCAL,
            Reason.STAYS_ON_DEVICE,
            f"{case.message}, but the request is '{label}'{found} and may not leave the device",
        )
    return request.answer(
        Action.REJECT,
        Reason.MAY_NOT_LEAVE,
        f"{case.message}, but the request is '{label}'{found} and may not leave the device",
    )


def _no_gateway(request: _Request, case: _CloudCase) -> Decision | None:
    """A device with no gateway keeps a preference local, not degraded; a necessity
    gets a clear refusal."""
    if request.facts.gateway:
        return None
    if case.soft and request.answers_locally:
        return request.answer(
            Action.LOCAL, Reason.NO_GATEWAY, f"{case.message}, but this device has no gateway"
        )
    return request.answer(
        Action.REJECT,
        Reason.NO_GATEWAY,
        f"{case.message}, but this device has no gateway to send it to",
    )


def _cloud_lacks_it(request: _Request, case: _CloudCase) -> Decision | None:
    """The gateway is known not to have the model the cloud would answer with: the
    device answers if it can, else a clear refusal (which the agent's fallback may
    still answer, degraded); nothing is sent to be refused."""
    facts = request.facts
    model = case.model or facts.model
    if model not in facts.cloud_lacks:
        return None
    if request.answers_locally:
        return request.answer(
            Action.LOCAL,
            Reason.NOT_IN_CLOUD,
            f"{case.message}, but the cloud does not have {model}: the device answers",
        )
    if not facts.on_device:
        message = f"{model} is not installed here and the cloud does not have it"
    else:
        message = f"{case.message}, but the cloud does not have {model}"
    return request.answer(Action.REJECT, Reason.NOT_IN_CLOUD, message)


def _cloud_too_slow(request: _Request, case: _CloudCase) -> Decision | None:
    """A cloud whose estimate (the link's round trip and bytes, and the remote time)
    misses the deadline: a preference yields to it, and the device answers; a
    necessity is refused up front rather than sent to time out (the agent's fallback
    may still answer, degraded). Where the cloud cannot be reached, that is the
    reason instead."""
    facts = request.facts
    if request.fits(facts.remote_ms) is not False:
        return None
    late = (
        f"{case.message}, but the cloud's ~{facts.remote_ms:.1f} ms{_parts(facts)} would "
        f"miss the {facts.deadline_ms:.1f} ms deadline"
    )
    if case.soft and request.answers_locally:
        return request.answer(Action.LOCAL, Reason.DEADLINE_REMOTE_TOO_SLOW, late)
    if not request.reachable:
        return None
    return request.answer(Action.REJECT, Reason.DEADLINE_REMOTE_TOO_SLOW, late)


def _cloud_unreachable(request: _Request, case: _CloudCase) -> Decision | None:
    """Offline or behind an open circuit breaker, a request that wanted the cloud
    runs locally, marked degraded, or gets a clear refusal."""
    facts = request.facts
    if request.reachable:
        return None
    why = "the device is offline" if not facts.online else "the circuit breaker is open"
    if request.answers_locally:
        return request.answer(
            Action.LOCAL_DEGRADED,
            Reason.OFFLINE if not facts.online else Reason.BREAKER_OPEN,
            f"{case.message}, but {why}: the local model answers, marked degraded",
        )
    return request.answer(
        Action.REJECT, Reason.CLOUD_UNREACHABLE, f"{case.message}, but {why} and it cannot run here"
    )


# in order: the first that speaks keeps the request from the cloud
_GATES: tuple[Callable[[_Request, _CloudCase], Decision | None], ...] = (
    _label_keeps_it_here,
    _no_gateway,
    _cloud_lacks_it,
    _cloud_too_slow,
    _cloud_unreachable,
)


def _offload(request: _Request, case: _CloudCase) -> Decision:
    """The cloud answers: from a redacted copy when the label says ``redact``."""
    if request.leave == "redact":
        return request.answer(
            Action.OFFLOAD_REDACTED,
            case.reason,
            f"{case.message}; the request is '{request.label}'{request.found}, so only a "
            "redacted copy leaves",
            case.model,
        )
    return request.answer(Action.OFFLOAD, case.reason, case.message, case.model)
