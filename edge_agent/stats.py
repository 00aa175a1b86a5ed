"""Recent latencies, summarised (for telemetry and the local API's status)."""

from __future__ import annotations

import threading
from collections import Counter, deque

import numpy as np

__all__ = ["LatencyWindow"]


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
