"""The one measurement core of the commands that measure and report: percentiles,
tables, JSON, machine facts (``edge-agent bench``, ``cloud-gateway bench``, the model
toolchain's figures, ``device list``; the project's ``benchmarks/`` use it too)."""

from __future__ import annotations

import json
import os
import platform
import resource
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "machine_info",
    "peak_rss_mb",
    "percentiles_ms",
    "render_table",
    "write_json",
]


def percentiles_ms(samples_ns: Sequence[int] | np.ndarray[Any, Any]) -> dict[str, float]:
    """p50/p95/p99 and mean of durations given in nanoseconds, in milliseconds."""
    values = np.asarray(samples_ns, dtype=np.float64) / 1e6
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {
        "p50_ms": round(float(p50), 4),
        "p95_ms": round(float(p95), 4),
        "p99_ms": round(float(p99), 4),
        "mean_ms": round(float(values.mean()), 4),
    }


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MB.

    Read from ``VmHWM`` in ``/proc/self/status``: ``ru_maxrss`` survives
    ``exec`` on Linux, so a freshly spawned process would report its
    parent's peak.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024.0, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def machine_info() -> dict[str, Any]:
    return {
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table, numbers right-aligned."""

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.0f}"
        return str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    numeric = [
        all(isinstance(row[i], (int, float)) or row[i] is None for row in rows)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if numeric[i] else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def publish(table: str, report: Any, path: Path | None) -> None:
    """A benchmark's end: print its table; write its report as JSON to ``path``, if any."""
    print(table)
    if path:
        write_json(path, report)
        print(f"wrote {path}")
