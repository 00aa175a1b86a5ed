"""The offload policy: every rule and every decision, pure (no servers, no clock)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from edge_agent.agent import DEFAULT_POLICY
from edge_agent.policy import (
    Action,
    DecisionCounter,
    LatencyEstimate,
    PolicyError,
    RequestFacts,
    decide,
    load_policy,
    parse_policy,
)
from edge_agent.policy.decide import expected_local_ms

RULES = load_policy(DEFAULT_POLICY)


def facts(model: str = "digits-light", **changes: object) -> RequestFacts:
    return replace(RequestFacts(model=model), **changes)  # type: ignore[arg-type]


def check(f: RequestFacts, action: Action, reason: str, model: str | None = None) -> None:
    decision = decide(f, RULES)
    assert (decision.action, decision.reason) == (action, reason), decision.message
    assert decision.message
    if model is not None:
        assert decision.model == model


def test_local_by_default_with_escalation_armed() -> None:
    decision = decide(facts(), RULES)
    assert decision.action == Action.LOCAL and decision.reason == "prefer_local"
    assert (decision.escalate_to, decision.escalate_below) == ("digits-heavy", 0.9)
    assert decision.label == "public"


def test_escalation_on_low_confidence() -> None:
    check(facts(local_confidence=0.97), Action.LOCAL, "confident")
    check(facts(local_confidence=0.42), Action.OFFLOAD, "low_confidence", model="digits-heavy")
    check(facts(local_confidence=0.42, label="personal"), Action.OFFLOAD_REDACTED, "low_confidence")
    check(facts(local_confidence=0.42, label="sensitive"), Action.LOCAL, "stays_on_device")
    check(facts(local_confidence=0.42, breaker_open=True), Action.LOCAL_DEGRADED, "breaker_open")
    check(facts(local_confidence=0.42, gateway=False), Action.LOCAL, "no_gateway")
    check(facts("ppocr-det", local_confidence=0.1), Action.LOCAL, "no_escalation")


def test_sensitivity_labels() -> None:
    check(facts("ppocr-det"), Action.OFFLOAD, "cloud_only")
    check(facts("ppocr-det", label="personal"), Action.OFFLOAD_REDACTED, "cloud_only")
    check(facts("ppocr-det", label="sensitive"), Action.REJECT, "may_not_leave")
    check(facts(label="sensitive", throttled=True), Action.LOCAL, "stays_on_device")


def test_findings_raise_the_label() -> None:
    decision = decide(facts("ppocr-det", findings=frozenset({"faces"})), RULES)
    assert decision.action == Action.OFFLOAD_REDACTED and decision.label == "personal"
    assert "faces found" in decision.message
    decision = decide(facts("ppocr-det", findings=frozenset({"pii"})), RULES)
    assert decision.action == Action.REJECT and decision.label == "sensitive"
    # a label never goes down: sensitive stays sensitive whatever is found
    assert (
        decide(facts("ppocr-det", label="sensitive", findings=frozenset({"faces"})), RULES).label
        == "sensitive"
    )


def test_model_placement() -> None:
    check(facts("face-detection-short-range"), Action.LOCAL, "device_only")
    check(
        facts("face-detection-short-range", on_device=False),
        Action.REJECT,
        "device_only_unavailable",
    )
    check(facts("some-model", on_device=False), Action.OFFLOAD, "not_on_device")
    check(facts(fits_memory=False), Action.OFFLOAD, "exceeds_memory_budget")
    check(facts("digits-heavy"), Action.OFFLOAD, "cloud_only")


def test_deadline() -> None:
    check(
        facts(local_ms=80.0, remote_ms=20.0, deadline_ms=50.0),
        Action.OFFLOAD,
        "deadline_local_too_slow",
    )
    check(facts(local_ms=80.0, remote_ms=60.0, deadline_ms=50.0), Action.LOCAL, "prefer_local")
    check(facts(local_ms=5.0, remote_ms=20.0, deadline_ms=50.0), Action.LOCAL, "prefer_local")
    # a preference for the cloud yields when the cloud would miss the deadline
    check(
        facts(local_confidence=0.3, remote_ms=80.0, deadline_ms=50.0),
        Action.LOCAL,
        "deadline_remote_too_slow",
    )
    check(
        facts(throttled=True, remote_ms=80.0, deadline_ms=50.0),
        Action.LOCAL,
        "deadline_remote_too_slow",
    )
    # the margin counts: 48 + 2 fits 50, 49 + 2 does not
    check(
        facts(local_ms=49.0, remote_ms=10.0, deadline_ms=50.0),
        Action.OFFLOAD,
        "deadline_local_too_slow",
    )
    check(facts(local_ms=48.0, remote_ms=10.0, deadline_ms=50.0), Action.LOCAL, "prefer_local")


def test_the_local_estimate_counts_the_queue_ahead() -> None:
    # 10 ms a run fits a 30 ms deadline alone; with 3 requests ahead it takes ~40 ms
    alone = facts(local_ms=10.0, remote_ms=5.0, deadline_ms=30.0)
    check(alone, Action.LOCAL, "prefer_local")
    queued = replace(alone, local_queue=3)
    check(queued, Action.OFFLOAD, "deadline_local_too_slow")
    assert "locally ~40.0 ms (3 ahead, ~10.0 ms each)" in decide(queued, RULES).message
    assert expected_local_ms(queued) == 40.0 and expected_local_ms(facts()) is None
    # the queue ahead of a request that stays on the device does not move it
    check(replace(queued, label="sensitive"), Action.LOCAL, "stays_on_device")


def test_a_deadline_without_estimates_says_so() -> None:
    unknown = decide(facts(deadline_ms=200.0), RULES)
    assert (unknown.action, unknown.reason) == (Action.LOCAL, "prefer_local")
    assert unknown.message.endswith(
        "; no latency estimate yet for the device or the cloud to weigh against the "
        "200.0 ms deadline"
    )
    local_known = decide(facts(deadline_ms=200.0, local_ms=3.0), RULES)
    assert "no latency estimate yet for the cloud to weigh" in local_known.message
    # a cloud-only model is not waiting for a local estimate
    heavy = decide(facts("digits-heavy", deadline_ms=200.0), RULES)
    assert "no latency estimate yet for the cloud to weigh" in heavy.message
    for known in (
        facts(deadline_ms=200.0, local_ms=3.0, remote_ms=9.0),
        facts(),  # no deadline: nothing to weigh
        facts(deadline_ms=200.0, local_ms=3.0, gateway=False),
    ):
        assert "no latency estimate" not in decide(known, RULES).message


def test_device_state() -> None:
    check(facts(throttled=True), Action.OFFLOAD, "thermal_throttled")
    check(facts(critical=True), Action.OFFLOAD, "thermal_critical")
    check(facts(critical=True, label="sensitive"), Action.REJECT, "may_not_leave")
    check(facts(cpu_load=0.95), Action.OFFLOAD, "cpu_overloaded")
    check(facts(cpu_load=0.5), Action.LOCAL, "prefer_local")
    quiet = replace(RULES, offload_when_throttled=False)
    assert decide(facts(throttled=True), quiet).action == Action.LOCAL
    hot = replace(RULES, local_when_critical=True)
    assert decide(facts(critical=True), hot).action == Action.LOCAL


def test_link_state() -> None:
    check(facts(throttled=True, online=False), Action.LOCAL_DEGRADED, "offline")
    check(facts(throttled=True, breaker_open=True), Action.LOCAL_DEGRADED, "breaker_open")
    check(facts("ppocr-det", breaker_open=True), Action.REJECT, "cloud_unreachable")
    check(facts("ppocr-det", gateway=False), Action.REJECT, "no_gateway")
    check(facts(throttled=True, gateway=False), Action.LOCAL, "no_gateway")


def test_the_cloud_lacking_the_model_keeps_it_here_or_says_so() -> None:
    lacks = frozenset({"digits-heavy"})
    # a preference (an unsure local answer): the local answer stands, not degraded
    check(facts(local_confidence=0.3, cloud_lacks=lacks), Action.LOCAL, "not_in_cloud")
    busy = decide(facts(cpu_load=0.95, cloud_lacks=frozenset({"digits-light"})), RULES)
    assert (busy.action, busy.reason) == (Action.LOCAL, "not_in_cloud")
    assert busy.message.endswith("but the cloud does not have digits-light: the device answers")
    # a necessity: refused, nothing sent (the agent's fallback may stand in)
    heavy = decide(facts("digits-heavy", cloud_lacks=lacks, deadline_ms=50.0), RULES)
    assert (heavy.action, heavy.reason) == (Action.REJECT, "not_in_cloud")
    assert heavy.message == (
        "digits-heavy runs in the cloud only, but the cloud does not have digits-heavy"
    )
    # nothing here either: said as it is, without "no latency estimate"
    missing = decide(
        facts("digits-xl", on_device=False, cloud_lacks=frozenset({"digits-xl"})), RULES
    )
    assert (missing.action, missing.reason) == (Action.REJECT, "not_in_cloud")
    assert missing.message == "digits-xl is not installed here and the cloud does not have it"
    # a device-only model that is not installed says so
    absent = decide(facts("face-detection-short-range", on_device=False), RULES)
    assert "it is not installed here" in absent.message


def test_a_cloud_too_slow_for_the_deadline_is_priced_up_front() -> None:
    parts = "round trip 40.0 ms + 4.9 MB at 10.0 Mbit/s 3900.0 ms + gateway 60.0 ms"
    slow = facts("ppocr-det", remote_ms=4000.0, remote_parts=parts, deadline_ms=1000.0)
    decision = decide(slow, RULES)
    assert (decision.action, decision.reason) == (Action.REJECT, "deadline_remote_too_slow")
    assert decision.message == (
        f"ppocr-det runs in the cloud only, but the cloud's ~4000.0 ms ({parts}) would "
        "miss the 1000.0 ms deadline"
    )
    # a preference yields to it: the device answers
    check(
        replace(slow, model="digits-light", throttled=True),
        Action.LOCAL,
        "deadline_remote_too_slow",
    )
    # unreachable: that is what is said
    check(replace(slow, breaker_open=True), Action.REJECT, "cloud_unreachable")
    # in time: offloaded
    check(replace(slow, remote_ms=300.0), Action.OFFLOAD, "cloud_only")


def test_prefer_cloud() -> None:
    cloudy = replace(RULES, prefer="cloud")
    decision = decide(facts(), cloudy)
    assert (decision.action, decision.reason) == (Action.OFFLOAD, "prefer_cloud")
    assert decide(facts(remote_ms=90.0, deadline_ms=50.0), cloudy).action == Action.LOCAL


def test_decisions_serialise() -> None:
    data = decide(facts("ppocr-det", label="personal"), RULES).to_dict()
    assert data["decision"] == "OFFLOAD_REDACTED" and data["reason"] == "cloud_only"
    assert "only a redacted copy leaves" in data["explanation"]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[sensitivity]\npersonal = "share"\n',
            r"sensitivity.personal: expected one of 'free', 'redact', 'local', got 'share'",
        ),
        (
            '[sensitivity]\npublic = "local"\nsensitive = "free"\n',
            r"sensitivity: a more sensitive label may not leave",
        ),
        (
            '[models.a]\nescalate_to = "b"\n',
            r"models.a.escalate_to: escalate_to and escalate_below go together",
        ),
        (
            '[models.a]\nescalate_to = "a"\nescalate_below = 0.5\n',
            r"a model cannot escalate to itself",
        ),
        (
            '[models.a]\nescalate_to = "b"\nescalate_below = 1.5\n',
            r"models.a.escalate_below: expected a number >= 0.0 and <= 1.0",
        ),
        (
            '[models.a]\nplacement = "edge"\n',
            r"models.a.placement: expected one of 'device', 'cloud', 'either'",
        ),
        ("[device]\nmax_load = 1\n", r"device.max_load: unknown field"),
        ("[deadline\n", r"invalid TOML"),
    ],
)
def test_policy_file_errors(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PolicyError, match=message) as info:
        load_policy(path)
    assert str(path) in str(info.value)


def test_an_empty_policy_has_safe_defaults() -> None:
    rules = parse_policy({})
    assert rules.leave_mode("sensitive") == "local" and rules.leave_mode("personal") == "redact"
    assert rules.effective_label(None, {"faces"}) == "personal"


def test_estimates_and_counts() -> None:
    estimate = LatencyEstimate(alpha=0.5)
    estimate.observe(10.0)
    estimate.observe(20.0)
    assert estimate.value == 15.0 and estimate.count == 2
    counter = DecisionCounter()
    counter.count(decide(facts(), RULES))
    counter.count(decide(facts(throttled=True), RULES))
    counter.count(decide(facts(throttled=True), RULES))
    assert counter.snapshot() == {("LOCAL", "prefer_local"): 1, ("OFFLOAD", "thermal_throttled"): 2}
    assert counter.total(Action.OFFLOAD) == 2


def test_the_device_profile_gives_the_offload_defaults(tmp_path: Path) -> None:
    from edge_agent.profiles.schema import OffloadPreferences

    leaning = OffloadPreferences(prefer="cloud", offload_when_throttled=False)
    rules = load_policy(DEFAULT_POLICY, device=leaning)
    assert rules.prefer == "cloud" and rules.offload_when_throttled is False
    assert decide(facts(), rules).reason == "prefer_cloud"
    assert decide(facts(), RULES).reason == "prefer_local"  # no profile: the defaults
    # what a policy file says wins over the profile
    path = tmp_path / "policy.toml"
    path.write_text('[defaults]\nprefer = "local"\n[device]\noffload_when_throttled = true\n')
    rules = load_policy(path, device=leaning)
    assert rules.prefer == "local" and rules.offload_when_throttled is True
