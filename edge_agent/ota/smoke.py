"""The smoke test of a new model: load it from memory, run its golden inputs, time it.

A model that does not load, whose outputs are off its golden outputs, or
that is slower than the profile's latency budget does not become active.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from edge_agent.profiles.schema import DeviceProfile
from edge_core.errors import EdgeError, SmokeTestError
from edge_core.package import ModelPackage
from edge_core.runtime import open_best

__all__ = ["smoke_test"]


def smoke_test(package: ModelPackage, profile: DeviceProfile, *, runs: int = 5) -> dict[str, Any]:
    """Load ``package`` (from memory), run its golden inputs, check outputs and latency.

    Raises:
        SmokeTestError: it does not load, its outputs are off, or it is too slow.
    """
    try:
        variant, session = open_best(
            package,
            profile.runtime,
            precisions=profile.precisions,
            formats=profile.formats,
            profile_name=f"profile {profile.id}",
        )
        golden = package.golden()
        outputs = session.run(golden.inputs)
    except EdgeError as exc:
        raise SmokeTestError(f"{package.qualified_name} does not run: {exc}") from exc
    worst = 0.0
    for name, expected in golden.outputs.items():
        actual = outputs.get(name)
        if actual is None or actual.shape != expected.shape:
            raise SmokeTestError(
                f"{package.qualified_name}: output {name!r} is missing or misshapen"
            )
        if not variant.tolerance.allclose(actual, expected):
            worst = float(np.max(np.abs(actual.astype(np.float64) - expected)))
            raise SmokeTestError(
                f"{package.qualified_name} {variant.id}: output {name!r} is off the golden "
                f"output by {worst:.4g} (tolerance {variant.tolerance.atol:g})"
            )
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        session.run(golden.inputs)
        timings.append((time.perf_counter() - started) * 1000)
    latency = float(np.median(timings))
    budget = profile.latency_budget_ms
    if budget is not None and latency > budget:
        raise SmokeTestError(
            f"{package.qualified_name}: {latency:.1f} ms on its golden inputs, over the "
            f"profile's budget of {budget:g} ms"
        )
    return {"variant": variant.id, "latency_ms": round(latency, 3), "budget_ms": budget}
