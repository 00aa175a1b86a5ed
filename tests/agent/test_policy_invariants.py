"""The policy's invariants, over every input: generated facts and generated policy files.

Each check states one rule of docs/policy.md that must hold whatever the facts
(labels, findings, placement, device and link state, estimates, deadlines,
confidence) and whatever a valid policy file says. The policy is pure, so each
example is a few decisions; the examples are drawn once for all the checks,
which keeps the test to a few seconds.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.agent import DEFAULT_POLICY
from edge_agent.policy import (
    LABELS,
    Action,
    Decision,
    PolicyRules,
    Reason,
    RequestFacts,
    decide,
    load_policy,
    parse_policy,
)
from edge_agent.policy.rules import LEAVE_MODES

# the policy's models, each drawn a placement and maybe an escalation; and one it does not name
MODELS = ("alpha", "beta", "gamma", "delta")
UNLISTED = "unlisted"
SHIPPED = load_policy(DEFAULT_POLICY)
SHIPPED_SENSITIVITY = {
    **SHIPPED.leave,
    "default": SHIPPED.default_label,
    **SHIPPED.finding_labels,
}
# docs/policy.md's table: the reasons each action comes with (offload_failed is the agent's)
REASONS = {
    Action.LOCAL: {
        Reason.PREFER_LOCAL, Reason.DEVICE_ONLY, Reason.CONFIDENT, Reason.NO_ESCALATION,
        Reason.STAYS_ON_DEVICE, Reason.NO_GATEWAY, Reason.DEADLINE_REMOTE_TOO_SLOW,
        Reason.NOT_IN_CLOUD,
    },
    Action.OFFLOAD: {
        Reason.CLOUD_ONLY, Reason.NOT_ON_DEVICE, Reason.EXCEEDS_MEMORY_BUDGET,
        Reason.THERMAL_CRITICAL, Reason.THERMAL_THROTTLED, Reason.CPU_OVERLOADED,
        Reason.DEADLINE_LOCAL_TOO_SLOW, Reason.PREFER_CLOUD, Reason.LOW_CONFIDENCE,
    },
    Action.LOCAL_DEGRADED: {Reason.OFFLINE, Reason.BREAKER_OPEN},
    Action.REJECT: {
        Reason.DEVICE_ONLY_UNAVAILABLE, Reason.MAY_NOT_LEAVE, Reason.CLOUD_UNREACHABLE,
        Reason.NO_GATEWAY, Reason.NOT_IN_CLOUD, Reason.DEADLINE_REMOTE_TOO_SLOW,
    },
}  # fmt: skip
REASONS[Action.OFFLOAD_REDACTED] = REASONS[Action.OFFLOAD]
# reasons that are preferences for the cloud, not necessities
PREFERENCES = {
    Reason.LOW_CONFIDENCE,
    Reason.THERMAL_THROTTLED,
    Reason.CPU_OVERLOADED,
    Reason.PREFER_CLOUD,
}

labels = st.sampled_from(LABELS)
# whole milliseconds hit the deadline's margin exactly; fractions fall between
milliseconds = st.none() | st.integers(0, 120).map(float) | st.floats(0.0, 120.0)
unit = st.floats(0.0, 1.0)
# a device and a link mostly well (seven times in eight), so that every rule is reached
usually = st.sampled_from([True] * 7 + [False])
rarely = st.sampled_from([False] * 7 + [True])
placements = st.sampled_from(["either", "either", "device", "cloud"])


@st.composite
def sensitivities(draw: st.DrawFn) -> dict[str, str]:
    """A ``[sensitivity]`` table a policy file may hold: a more sensitive label never
    leaves more freely."""
    leave = sorted(draw(st.lists(st.sampled_from(LEAVE_MODES), min_size=3, max_size=3)),
                   key=LEAVE_MODES.index)  # fmt: skip
    return {
        **dict(zip(LABELS, leave, strict=True)),
        "default": draw(labels),
        "faces": draw(labels),
        "pii": draw(labels),
    }


@st.composite
def policies(draw: st.DrawFn, sensitivity: st.SearchStrategy[dict[str, str]]) -> PolicyRules:
    """A valid policy file, read as the agent reads one."""
    models: dict[str, Any] = {}
    for name in MODELS:
        entry: dict[str, Any] = {"placement": draw(placements)}
        if draw(st.booleans()):
            others = [m for m in (*MODELS, UNLISTED) if m != name]
            entry |= {"escalate_to": draw(st.sampled_from(others)), "escalate_below": draw(unit)}
        models[name] = entry
    document = {
        "sensitivity": draw(sensitivity),
        "defaults": {
            "placement": draw(placements),
            "prefer": draw(st.sampled_from(["local", "cloud"])),
        },
        "models": models,
        "device": {
            "offload_when_throttled": draw(st.booleans()),
            "max_cpu_load": draw(st.floats(0.0, 2.0)),
            "local_when_critical": draw(st.booleans()),
        },
        "deadline": {"margin_ms": draw(st.sampled_from([0.0, 2.0]) | st.floats(0.0, 20.0))},
    }
    return parse_policy(document)


any_policy = policies(sensitivities())
shipped_policy = policies(st.just(SHIPPED_SENSITIVITY))

facts = st.builds(
    RequestFacts,
    model=st.sampled_from((*MODELS, UNLISTED)),
    label=st.none() | labels,
    findings=st.frozensets(st.sampled_from(["faces", "pii"])),
    on_device=usually,
    fits_memory=usually,
    local_ms=milliseconds,
    local_queue=st.integers(0, 4),
    remote_ms=milliseconds,
    deadline_ms=milliseconds,
    throttled=rarely,
    critical=rarely,
    cpu_load=st.none() | st.none() | st.floats(0.0, 2.0),
    gateway=usually,
    online=usually,
    breaker_open=rarely,
    local_confidence=st.none() | st.none() | st.none() | unit,
    cloud_lacks=st.just(frozenset()) | st.frozensets(st.sampled_from((*MODELS, UNLISTED))),
)


def _freedom(decision: Decision) -> int:
    """How freely a decision lets the data leave: raw, redacted, or not at all."""
    return {Action.OFFLOAD: 2, Action.OFFLOAD_REDACTED: 1}.get(decision.action, 0)


@pytest.mark.slow
@settings(max_examples=800, deadline=None)
@given(facts, shipped_policy)
def test_sensitive_data_never_leaves_and_faces_leave_only_redacted(
    f: RequestFacts, rules: PolicyRules
) -> None:
    """With the shipped sensitivity table (``sensitive`` and ``pii``: local; ``personal``
    and ``faces``: redact), whatever else the policy and the facts say."""
    decision = decide(f, rules)
    if f.label == "sensitive" or "pii" in f.findings:
        assert not decision.leaves_device, decision
        assert decision.label == "sensitive"
    if f.label == "personal" or "faces" in f.findings:
        assert decision.action != Action.OFFLOAD, decision


def _label_lets_it_leave(f: RequestFacts, rules: PolicyRules, decision: Decision) -> None:
    """The effective label is the strictest of the request's and its findings', and
    only what it lets leave leaves: raw when ``free``, redacted when ``redact``."""
    implied = [rules.finding_labels[kind] for kind in f.findings]
    assert decision.label == max([f.label or rules.default_label, *implied], key=LABELS.index)
    leave = rules.leave_mode(decision.label)
    allowed = {"free": Action.OFFLOAD, "redact": Action.OFFLOAD_REDACTED, "local": None}[leave]
    assert not decision.leaves_device or decision.action == allowed, leave


def _unreachable_cloud_is_never_sent_to(
    f: RequestFacts, rules: PolicyRules, decision: Decision
) -> None:
    """Offline, behind an open breaker or with no gateway, nothing leaves; degraded means
    a gateway that cannot be reached, and a local-only device is never degraded."""
    if not (f.gateway and f.online and not f.breaker_open):
        assert not decision.leaves_device
    if decision.action == Action.LOCAL_DEGRADED:
        assert f.gateway and not (f.online and not f.breaker_open)
        assert decision.reason == (Reason.OFFLINE if not f.online else Reason.BREAKER_OPEN)
    if not f.gateway:
        assert decision.action in (Action.LOCAL, Action.REJECT)


def _nothing_goes_to_a_model_the_cloud_lacks(
    f: RequestFacts, rules: PolicyRules, decision: Decision
) -> None:
    """The cloud is never sent a request for a model it is known not to have."""
    if decision.leaves_device:
        assert decision.model not in f.cloud_lacks


def _device_answers_only_what_it_can_run(
    f: RequestFacts, rules: PolicyRules, decision: Decision
) -> None:
    """Before the local run, the device answers only a model it has, that fits, that
    its placement lets run there, and not above the critical temperature (unless the
    policy allows it); a model placed on the device does not leave."""
    if f.local_confidence is not None:
        return
    placement = rules.rule(f.model).placement
    if placement == "device":
        assert not decision.leaves_device
    if decision.action in (Action.LOCAL, Action.LOCAL_DEGRADED):
        assert placement != "cloud" and f.on_device and f.fits_memory
        assert not f.critical or rules.local_when_critical


def _preference_never_misses_a_known_deadline(
    f: RequestFacts, rules: PolicyRules, decision: Decision
) -> None:
    """A preference for the cloud, or a local estimate too slow, sends a request only
    to a cloud whose estimate fits the deadline."""
    if not decision.leaves_device or f.remote_ms is None or f.deadline_ms is None:
        return
    if decision.reason in PREFERENCES or decision.reason == Reason.DEADLINE_LOCAL_TOO_SLOW:
        assert f.remote_ms + rules.deadline_margin_ms <= f.deadline_ms


def _says_why_and_escalates_as_configured(
    f: RequestFacts, rules: PolicyRules, decision: Decision
) -> None:
    """Every decision gives a reason of its action (docs/policy.md's table) and a
    sentence; only a low-confidence answer goes to another model, the one configured,
    and only a local decision before the local run is armed to escalate."""
    assert decision.reason in REASONS[decision.action]
    assert decision.message
    rule = rules.rule(f.model)
    if decision.leaves_device and decision.reason == Reason.LOW_CONFIDENCE:
        assert f.local_confidence is not None and rule.escalate_below is not None
        assert f.local_confidence < rule.escalate_below
        assert decision.model == rule.escalate_to
    else:
        assert decision.model == f.model
    if decision.escalate_to is not None:
        assert decision.action == Action.LOCAL and f.local_confidence is None
        assert (decision.escalate_to, decision.escalate_below) == (
            rule.escalate_to,
            rule.escalate_below,
        )


INVARIANTS = (
    _label_lets_it_leave,
    _unreachable_cloud_is_never_sent_to,
    _nothing_goes_to_a_model_the_cloud_lacks,
    _device_answers_only_what_it_can_run,
    _preference_never_misses_a_known_deadline,
    _says_why_and_escalates_as_configured,
)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(facts, any_policy, st.frozensets(st.sampled_from(["faces", "pii"])))
def test_the_invariants_hold_whatever_the_facts_and_the_policy(
    f: RequestFacts, rules: PolicyRules, more: frozenset[str]
) -> None:
    decision = decide(f, rules)
    for invariant in INVARIANTS:
        try:
            invariant(f, rules, decision)
        except AssertionError as exc:
            raise AssertionError(f"{invariant.__name__}: {decision}") from exc
    # findings only make a request stricter: so the agent inspects only what would leave
    stricter = decide(replace(f, findings=f.findings | more), rules)
    assert _freedom(stricter) <= _freedom(decision), (decision, stricter)
    if not decision.leaves_device:  # what stays needs no inspection: it stays, answered or not
        assert not stricter.leaves_device, (decision, stricter)
        assert (stricter.action == Action.REJECT) == (decision.action == Action.REJECT)
