"""The table of a build (what ``models build`` prints last, and the figures page shows)."""

from __future__ import annotations

from typing import Any

from edge_core.report import render_table

__all__ = ["format_build"]


def _agreement(verification: dict[str, Any]) -> str | None:
    for key, label in (("agreement", "top-1"), ("iou", "IoU"), ("relative_error", "rel. err")):
        if key in verification:
            return f"{label} {verification[key]:.4g}"
    return None


def format_build(report: dict[str, Any]) -> str:
    """The variants of one build: nodes, latency, speed-up, agreement, prediction."""
    build = report.get("build", {})
    lines = [f"{report['model']} v{report['version']} (from {build.get('source', '?')})"]
    nodes = build.get("optimization", {}).get("nodes")
    if nodes:
        lines.append(f"graph optimization (basic): {nodes['before']} -> {nodes['after']} nodes")
    source_ms = report.get("source_p50_ms")
    rows = []
    for entry in report["variants"]:
        bench = entry.get("benchmark") or {}
        measured, predicted = bench.get("p50_ms"), entry.get("predicted_ms")
        error = (
            f"{100 * (predicted - measured) / measured:+.0f}%"
            if measured and predicted is not None
            else None
        )
        verification = entry.get("verification", {})
        rows.append(
            [
                entry["variant"],
                entry.get("nodes"),
                measured,
                bench.get("speedup_vs_fp32"),
                bench.get("items_per_s"),
                bench.get("best_batch"),
                _agreement(verification),
                verification.get("accuracy"),
                predicted,
                error,
            ]
        )
    headers = ["variant", "nodes", "p50 ms", "x FP32", "items/s", "batch", "vs FP32",
               "accuracy", "predicted ms", "error"]  # fmt: skip
    lines.append(render_table(headers, rows))
    if source_ms:
        lines.append(f"the source model as given: p50 {source_ms} ms")
    int8 = build.get("int8")
    if int8:
        tried = "; ".join(
            f"{t['config']}: " + ", ".join(f"{k} {v}" for k, v in t.items() if k != "config")
            for t in int8["tried"]
        )
        lines.append(f"INT8 kept {int8['chosen']} (tried: {tried})")
    fp16 = build.get("fp16")
    if fp16 and fp16.get("kept_fp32"):
        lines.append(f"FP16 kept {len(fp16['kept_fp32'])} nodes in FP32 (near the FP16 range)")
    for entry in report.get("left_out", []):
        lines.append(f"left out {entry['variant']}: {entry['reason']}")
    if report.get("profile"):
        lines.append(f"predicted on profile {report['profile']}")
    return "\n".join(lines)
