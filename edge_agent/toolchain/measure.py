"""Latency of the variants of a build, side by side on this machine.

Every variant is loaded (with the runtime options given: the device profile's,
or the defaults) and run round-robin, a few calls each per round, so that a
noisy machine slows all of them alike and the ratios hold. ONNX Runtime's
threads do not spin here: the idle sessions' spinning threads would take the
cores from the one being measured. The result per
variant: p50 and p95 at batch 1, and items per second at the best batch size
tried (batches that keep one call under half a second, where the batch
dimension is dynamic). A benchmark names the machine it ran on.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from edge_core.report import machine_info, percentiles_ms
from edge_core.runtime import RuntimeOptions, Session, open_model

__all__ = ["MeasureSettings", "measure"]

Array = np.ndarray[Any, Any]
BATCHES = (1, 4, 16, 64)


@dataclass(frozen=True)
class MeasureSettings:
    rounds: int = 5
    seconds_per_round: float = 0.2  # per variant
    batches: bool = True  # also measure items/s at larger batches
    call_limit_s: float = 0.5  # larger batches only while one call stays below this


def _batch(item: Mapping[str, Array], size: int) -> dict[str, Array]:
    return {name: np.ascontiguousarray(np.repeat(a, size, axis=0)) for name, a in item.items()}


def _dynamic_batch(session: Session) -> bool:
    return all(spec.shape and spec.shape[0] < 0 for spec in session.inputs)


def measure(
    variants: Mapping[str, tuple[str, bytes]],
    item: Mapping[str, Array],
    options: RuntimeOptions | None = None,
    settings: MeasureSettings = MeasureSettings(),
) -> dict[str, dict[str, Any]]:
    """Measure ``variants`` (id -> (format, bytes)) on ``item`` (one batch row).

    Raises:
        BackendError: a runtime refused a variant.
        InferenceError: a run failed.
    """
    options = replace(options or RuntimeOptions(warmup=3), allow_spinning=False)
    sessions = {vid: open_model(fmt, data, options) for vid, (fmt, data) in variants.items()}
    for session in sessions.values():
        session.warm_up(options.warmup)
        session.run(item)
    calls = {vid: session.raw_call(item) for vid, session in sessions.items()}
    samples: dict[str, list[int]] = {vid: [] for vid in sessions}
    for _ in range(settings.rounds):
        for vid, call in calls.items():
            start = time.perf_counter()
            while True:
                t0 = time.perf_counter_ns()
                call()
                samples[vid].append(time.perf_counter_ns() - t0)
                if time.perf_counter() - start >= settings.seconds_per_round:
                    break
    results: dict[str, dict[str, Any]] = {}
    for vid, session in sessions.items():
        stats = percentiles_ms(samples[vid])
        entry: dict[str, Any] = {
            "p50_ms": stats["p50_ms"],
            "p95_ms": stats["p95_ms"],
            "samples": len(samples[vid]),
            "backend": session.backend,
            "device": session.device,
            "threads": options.threads,
        }
        best = (1, 1000.0 / stats["p50_ms"])
        if settings.batches and _dynamic_batch(session):
            batched = _batched(session, item, stats["p50_ms"], settings.call_limit_s)
            best = max([best, *batched], key=lambda b: b[1])
        entry["best_batch"] = best[0]
        entry["items_per_s"] = round(best[1], 1)
        entry["machine"] = machine_info()
        results[vid] = entry
        session.close()
    return results


def _batched(
    session: Session, item: Mapping[str, Array], p50_ms: float, limit_s: float
) -> Sequence[tuple[int, float]]:
    out = []
    for size in BATCHES[1:]:
        if size * p50_ms / 1000 > limit_s:
            break
        feeds = _batch(item, size)
        call = session.raw_call(feeds)
        call()
        times = []
        for _ in range(max(3, int(0.2 / max(size * p50_ms / 1000, 1e-4)))):
            t0 = time.perf_counter_ns()
            call()
            times.append(time.perf_counter_ns() - t0)
        out.append((size, size / (float(np.median(times)) / 1e9)))
    return out
