"""What the agent has done, counted: decisions by action and reason, degraded
and cached answers, and recent latencies by where a request was answered.

One lock guards the counts; :meth:`AgentStats.snapshot` is a consistent copy
(telemetry and the local API read it from other threads). Every key comes
from a bounded set (actions, reasons, ``device``/``cloud``/``cache``), never
from a request.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Any

import numpy as np

from edge_agent.policy import Decision, DecisionCounter

__all__ = ["AgentStats", "LatencyWindow"]


class LatencyWindow:
    """The last ``size`` latencies of each key (e.g. where a request was answered)."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._recent: dict[str, deque[float]] = {}
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def observe(self, key: str, milliseconds: float) -> None:
        with self._lock:
            recent = self._recent.get(key)
            if recent is None:
                recent = self._recent[key] = deque(maxlen=self.size)
            recent.append(milliseconds)
            self._counts[key] += 1

    def summary(self) -> dict[str, dict[str, float]]:
        """Per key: requests since start, and percentiles of the recent ones (ms)."""
        with self._lock:
            recent = {key: np.array(values) for key, values in self._recent.items()}
            counts = dict(self._counts)
        out = {}
        for key, values in sorted(recent.items()):
            p50, p95, p99 = np.percentile(values, [50, 95, 99])
            out[key] = {
                "count": counts[key],
                "window": len(values),
                "p50_ms": round(float(p50), 3),
                "p95_ms": round(float(p95), 3),
                "p99_ms": round(float(p99), 3),
                "max_ms": round(float(values.max()), 3),
            }
        return out


class AgentStats:
    """The agent's counters (thread-safe)."""

    def __init__(self) -> None:
        self.decisions = DecisionCounter()
        self.latency = LatencyWindow()
        self._lock = threading.Lock()
        self._degraded = 0
        self._cached = 0

    def decided(self, decision: Decision) -> None:
        self.decisions.count(decision)

    def answered(self, where: str, latency_ms: float, *, degraded: bool, cached: bool) -> None:
        """One answer: a cached one counts as cached, any other degraded one as degraded."""
        self.latency.observe(where, latency_ms)
        if cached or degraded:
            with self._lock:
                if cached:
                    self._cached += 1
                else:
                    self._degraded += 1

    @property
    def degraded(self) -> int:
        with self._lock:
            return self._degraded

    @property
    def cached_answers(self) -> int:
        with self._lock:
            return self._cached

    def snapshot(self) -> dict[str, Any]:
        """Decisions by ``(action, reason)``, degraded and cached answers, latencies."""
        with self._lock:
            degraded, cached = self._degraded, self._cached
        return {
            "decisions": self.decisions.snapshot(),
            "degraded": degraded,
            "cached_answers": cached,
            "latency": self.latency.summary(),
        }
