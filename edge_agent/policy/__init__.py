"""The offload policy: rules from a file (:mod:`.rules`), a pure decision
(:mod:`.decide`), and the bookkeeping the decision needs (latency estimates,
decision counts)."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

from edge_agent.policy.decide import Action, Decision, RequestFacts, decide
from edge_agent.policy.reasons import Reason
from edge_agent.policy.rules import (
    LABELS,
    ModelRule,
    PolicyError,
    PolicyRules,
    load_policy,
    parse_policy,
)

__all__ = [
    "LABELS",
    "Action",
    "Decision",
    "DecisionCounter",
    "LatencyEstimate",
    "ModelRule",
    "PolicyError",
    "PolicyRules",
    "Reason",
    "RequestFacts",
    "decide",
    "load_policy",
    "parse_policy",
]


@dataclass
class LatencyEstimate:
    """An exponential moving average of observed latencies, in milliseconds."""

    alpha: float = 0.2
    value: float | None = None
    count: int = 0

    def observe(self, milliseconds: float) -> None:
        self.count += 1
        if self.value is None:
            self.value = milliseconds
        else:
            self.value += self.alpha * (milliseconds - self.value)


class DecisionCounter:
    """How many decisions of each action and reason were made (thread-safe)."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def count(self, decision: Decision) -> None:
        with self._lock:
            self._counts[(decision.action.value, decision.reason)] += 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)

    def total(self, action: Action | None = None) -> int:
        with self._lock:
            return sum(
                n for (a, _), n in self._counts.items() if action is None or a == action.value
            )
