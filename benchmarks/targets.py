"""The performance targets of MISSION §7 (P1-P13), and how each is judged from the JSON of
the benchmark that measures it (:mod:`benchmarks.page` shows them beside the figures).
A judge reads a report and says what was measured and whether it meets the target."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["TARGETS", "Report", "Target", "Verdict", "judge", "verdict"]

Report = dict[str, Any]
Verdict = tuple[str, bool | None]  # what was measured, and whether it meets the target

Judge = Callable[[Report], Verdict]


def _p1(report: Report) -> Verdict:
    path = report["agent_path"]
    target = float(report.get("targets", {}).get("overhead_us_p50", 25.0))
    added = float(path["added_us"])
    return f"{report['model']} ({path['variant']}): +{added:.1f} µs", added <= target


def _p3(report: Report) -> Verdict:
    variants = {v["variant"]: v for v in report["variants"]}
    parts, verdicts = [], []
    for c in report["int8_vs_fp32"]:
        fp32 = variants[f"{c['format']}-fp32"]["p50_ms"]
        text = f"{report['model']} {c['format']}: {c['speedup_p50']}x at batch 1"
        if "accuracy_delta_points" in c:
            text += f", {c['accuracy_delta_points']:+.2f} points"
        if fp32 < 0.5:
            parts.append(f"{text} (not judged: FP32 p50 {fp32:g} ms < 0.5 ms)")
            continue
        parts.append(text)
        verdicts.append(c["speedup_p50"] >= 1.5 and c.get("accuracy_delta_points", 0.0) >= -1.0)
    if not parts:
        return f"{report['model']}: no INT8 and FP32 variants of one format", None
    return "; ".join(parts), (all(verdicts) if verdicts else None)


def _p2(report: Report) -> Verdict:
    summary = report["summary"]
    parts = [
        f"{protocol}: {100 * s['share_of_lower_limit']:.0f}% of the lower limit, "
        f"p99 {s['batching_p99_ms']:.1f} ms, {s['gain_over_per_request']}x per-request"
        for protocol, s in ((p, summary[p]) for p in ("grpc", "http"))
    ]
    met = all(bool(summary[p]["meets_target"]) for p in ("grpc", "http"))
    return f"at {summary['clients']} clients, " + "; ".join(parts), met


def _p2b(report: Report) -> Verdict:
    summary = report["summary"]
    parts = [
        f"{label}: {row['ratio']}x {row['best_peer']}"
        + (f", p99 {row['servers']['gateway']['p99_ms']} ms" if "gateway" in row["servers"] else "")
        for label, row in summary["cases"].items()
        if "ratio" in row
    ]
    judged = [row for row in summary["cases"].values() if "meets_target" in row]
    return "; ".join(parts) or "no peer ran", bool(judged) and bool(summary["meets_target"])


def _p4(report: Report) -> Verdict:
    summary = report["summary"]
    growth = ", ".join(
        f"{s['model_mb']} MB: +{s['install_peak_rss_increase_mb']} MB" for s in report["sizes"]
    )
    return (
        f"slowest {summary['min_install_mb_s']:.0f} MB/s; peak RSS {growth}",
        bool(summary["meets_throughput_target"]),
    )


def _p5(report: Report) -> Verdict:
    ratios = report["ratios"]
    return (
        f"transport {ratios['transport']}x, Agent.infer {ratios['agent']}x the floor "
        f"({report['floor_p50_ms']} ms)",
        bool(report["meets_target"]),
    )


def _p6(report: Report) -> Verdict:
    parts = [
        f"{name}: {s['rss_median_mb']} MB, READY in {s['ready_max_s']} s (max)"
        for name, s in report["startup"].items()
    ]
    met = all(s["rss_target_met"] and s["ready_target_met"] for s in report["startup"].values())
    return "; ".join(parts), met


def _p7(report: Report) -> Verdict:
    summary = report["summary"]
    return (
        f"{summary['hybrid_minus_cloud_points']:+.2f} points against cloud-only, "
        f"{100 * summary['hybrid_offloaded_share']:.1f}% offloaded",
        bool(summary["meets_target"]),
    )


def _p12(report: Report) -> Verdict:
    variants = {v["variant"]: v for v in report["variants"]}
    left_out = {v["variant"]: v for v in report.get("left_out", [])}
    if "onnx-int8" in left_out:
        entry = left_out["onnx-int8"]
        return f"{report['model']}: INT8 left out ({entry['reason']})", False
    int8, fp32 = variants["onnx-int8"], variants["onnx-fp32"]
    speedup = float(int8["benchmark"]["speedup_vs_fp32"])
    iou = float(int8["verification"]["iou"])
    shape = "x".join(str(d) for d in report.get("input_shape", [])) or "?"
    return (
        f"{report['model']} at {shape}: INT8 {speedup}x FP32 at batch 1 "
        f"({int8['benchmark']['p50_ms']} against {fp32['benchmark']['p50_ms']} ms), "
        f"map IoU {iou:.3f}",
        speedup >= 1.5 and iou >= 0.9,
    )


def _p8(report: Report) -> Verdict:
    label = report["default"]  # the configuration the agent ships (the report names it)
    result = report["results"][label]
    return (
        f"{label}: recall {result['recall_from_32px']} on faces from 32 px "
        f"({result['missed_from_32px']} of {result['faces_from_32px']} missed), "
        f"false alarms in {result['false_alarm_photos']} of {result['photos']} face-free "
        f"photos, {result['ms_640x480']} ms a 640x480 picture",
        bool(result["meets_target"]),
    )


def _p9(report: Report) -> Verdict:
    parts, verdicts = [], []
    for entry in report["models"]:
        s = entry["summary"]
        if s["one_stage_dominates"]:
            speed = (
                f"{s['speedup']}x ({s['slowest_stage']} dominates: at most "
                f"{s['pipeline_ceiling']}x, not judged)"
            )
        else:
            speed = f"{s['speedup']}x"
            verdicts.append(bool(s["meets_speedup_target"]))
        verdicts.append(bool(s["meets_latency_target"]))
        parts.append(
            f"{entry['model']}: {speed}, p99 {s['sustained_p99_ms']} ms at "
            f"{s['sustained_fps']:g} frames/s (bound {s['latency_bound_ms']} ms)"
        )
    return "; ".join(parts), all(verdicts) if verdicts else None


def _p10(report: Report) -> Verdict:
    parts = [
        f"{protocol}: {100 * s['throughput_loss']:.1f}% lost at {s['clients']} clients, "
        f"p50 +{s['p50_added_ms']:.2f} ms"
        + (
            f" (a bare relay alone +{s['relay_p50_added_ms']:.2f} ms)"
            if "relay_p50_added_ms" in s
            else ""
        )
        for protocol, s in report["summary"].items()
    ]
    summary = report["summary"].values()
    met = bool(summary) and all(bool(s["meets_target"]) for s in summary)
    return f"{report['engine']}: " + "; ".join(parts), met


def _p11(report: Report) -> Verdict:
    s = report["summary"]
    return (
        f"{s['devices']} devices on {s['replicas']} replica(s): rollout to 10% in "
        f"{s['rollout_10_s']} s, 100% in {s['rollout_100_s']} s; {s['requests_per_s']} req/s, "
        f"p99 {s['p99_ms']} ms, {s['queries_per_check']} queries a check",
        None,  # measured, not judged: the plan is judged by reading it
    )


def _p13(report: Report) -> Verdict:
    rows = {(r["rate_mbit"], r["form"]): r for r in report["rows"]}
    rates = sorted({rate for rate, _ in rows})
    slow = min(rates, key=lambda rate: abs(rate - 10.0))
    tensor, encoded = rows[(slow, "tensor")], rows[(slow, "encoded")]
    fraction = max(rows[(rate, "encoded")]["bytes_up"] for rate in rates) / tensor["bytes_up"]
    iou = min(rows[(rate, "encoded")]["boxes_iou"] for rate in rates)
    speedup = tensor["p50_ms"] / encoded["p50_ms"]
    text = (
        f"{fraction:.3f} of the tensor's bytes (1/{1 / fraction:.0f}), boxes IoU ≥ {iou:.3f}; "
        f"at {slow:g} Mbit/s p50 {encoded['p50_ms']:.0f} against {tensor['p50_ms']:.0f} ms "
        f"({speedup:.1f}x)"
    )
    return text, fraction <= 1 / 20 and iou >= 0.9 and speedup >= 3.0


@dataclass(frozen=True)
class Target:
    id: str
    what: str
    target: str
    kind: str  # the benchmark whose JSON judges it ("" : none yet)
    judge: Judge | None = None


TARGETS: tuple[Target, ...] = (
    Target("P1", "agent in-process overhead over a raw runtime call", "≤ 25 µs at p50",
           "runtime", _p1),
    Target("P2", "gateway with dynamic batching, 64 clients", "≥ 70% of the lower limit, "
           "p99 ≤ 50 ms; gain over per-request reported", "gateway", _p2),
    Target("P2b", "the gateway beside Triton (PyTriton) and MLServer", "ahead of the best peer "
           "(gRPC ≥ 1.05×, HTTP ≥ 1.2×), p99 ≤ 50 ms", "peers", _p2b),
    Target("P3", "INT8 against FP32 where compute dominates (FP32 p50 ≥ 0.5 ms)",
           "≥ 1.5× faster, ≤ 1 point accuracy lost", "runtime", _p3),
    Target("P4", "OTA install (verify + decrypt + write)", "≥ 400 MB/s; extra memory bounded, "
           "not growing with model size", "ota", _p4),
    Target("P5", "offload round trip over gRPC against a bare gRPC echo",
           "≤ 1.5× the echo plus compute", "offload", _p5),
    Target("P6", "agent idle memory with one INT8 TFLite model / start to READY",
           "≤ 80 MB RSS / ≤ 1.5 s", "service", _p6),
    Target("P7", "hybrid: light local model, heavy cloud model on low confidence",
           "within 0.5 point of cloud-only, ≤ 25% offloaded", "hybrid", _p7),
    Target("P8", "face recall of the privacy inspector", "≥ 0.98 on faces ≥ 32 px, false "
           "alarms in ≤ 1 of 20 face-free photos, ≤ 30 ms a picture", "faces", _p8),
    Target("P9", "stream pipeline against a sequential capture loop", "≥ 1.5× frames/s; "
           "p99 ≤ 2 frame intervals + the slowest stage", "stream", _p9),
    Target("P10", "gateway in front of a remote engine", "≤ 15% throughput lost, "
           "≤ 1 ms added at p50", "remote", _p10),
    Target("P11", "fleet simulation (1,000 and 10,000 devices)", "measured, and a "
           "100,000-device plan from them", "fleet", _p11),
    Target("P12", "the toolchain's INT8 on PP-OCRv4 det", "≥ 1.5× FP32 at batch 1, "
           "map IoU ≥ 0.9", "build", _p12),
    Target("P13", "bytes per offloaded 640x480 picture", "≤ 1/20 of its FP32 tensor, same "
           "answer (IoU ≥ 0.9); ≥ 3× lower p50 over a 10 Mbit/s link", "offload-link", _p13),
)  # fmt: skip


def verdict(met: bool | None) -> str:
    return {True: "met", False: "**missed**", None: "not judged"}[met]


def judge(target: Target, report: Report) -> Verdict:
    assert target.judge is not None
    try:
        return target.judge(report)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        return f"not in this JSON ({type(exc).__name__}: {exc})", None
