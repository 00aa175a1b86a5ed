"""``edge-agent bench --model M``: a model's latency, throughput, memory and accuracy on
this device, each variant (in the manner of TFLite's ``benchmark_model``).

All variants are loaded in one process and measured round-robin, so their
ratios (INT8 against FP32) are side by side. Within each round the agent's
call path (:meth:`Session.run`: validation, dtype and quantization handling)
and the bare library call on the same session alternate call by call; the
difference of their medians is the agent's own overhead (target: at most
25 µs at p50). Peak RSS is measured per variant in a fresh process.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_agent.profiles.schema import DeviceProfile
from edge_core.package import ModelPackage, Variant
from edge_core.report import machine_info, peak_rss_mb, percentiles_ms, render_table
from edge_core.repository import ModelRepository
from edge_core.runtime import RuntimeOptions, Session, open_variant

if TYPE_CHECKING:
    from edge_agent.agent import Agent
    from edge_agent.offload import OffloadClient
    from edge_agent.policy import PolicyRules

__all__ = [
    "BenchSettings",
    "format_report",
    "kept_on_device",
    "quiet_agent",
    "run_agent_path",
    "run_bench",
]

OVERHEAD_TARGET_US = 25.0
INT8_SPEEDUP_TARGET = 1.5
INT8_ACCURACY_TARGET_POINTS = 1.0


@dataclass(frozen=True)
class BenchSettings:
    rounds: int = 5
    seconds_per_round: float = 0.3
    batch: int = 32
    rss: bool = True


def _sample_inputs(
    package: ModelPackage, session: Session, batch: int
) -> dict[str, np.ndarray[Any, Any]]:
    """Realistic inputs of ``batch`` rows: the held-out or golden data, else zeros."""
    source: dict[str, np.ndarray[Any, Any]] = {}
    if package.evaluation_file is not None and len(package.inputs) == 1:
        source = {package.inputs[0].name: package.evaluation()[0]}
    elif package.golden_file is not None:
        source = package.golden().inputs
    out = {}
    for spec in session.inputs:
        if spec.name in source:
            rows = source[spec.name].astype(spec.dtype)
            reps = -(-batch // len(rows))
            out[spec.name] = np.ascontiguousarray(np.concatenate([rows] * reps)[:batch])
        else:
            shape = [batch if i == 0 else (d if d > 0 else 1) for i, d in enumerate(spec.shape)]
            out[spec.name] = np.zeros(shape, dtype=spec.dtype)
    return out


def _batch_allowed(session: Session, batch: int) -> bool:
    return all(
        spec.shape and (spec.shape[0] < 0 or spec.shape[0] == batch) for spec in session.inputs
    )


def _accuracy(package: ModelPackage, session: Session) -> float | None:
    if package.task != "classification" or package.evaluation_file is None:
        return None
    inputs, labels = package.evaluation()
    name, output = package.inputs[0].name, package.outputs[0].name
    step = 64 if _batch_allowed(session, 64) else 1
    correct = 0
    for start in range(0, len(labels), step):
        scores = session.run({name: inputs[start : start + step]})[output]
        correct += int(np.sum(np.argmax(scores, axis=-1) == labels[start : start + step]))
    return correct / len(labels)


def _rss_child(
    root: str, name: str, version: int, variant_id: str, options: RuntimeOptions
) -> float:
    logging.getLogger().setLevel(logging.ERROR)  # the parent has reported the warnings already
    package = ModelRepository(Path(root)).get(name, version)
    session = open_variant(package, package.variant(variant_id), options)
    inputs = _sample_inputs(package, session, 1)
    for _ in range(20):
        session.run(inputs)
    return peak_rss_mb()


def _measure_rss(package: ModelPackage, variant: Variant, options: RuntimeOptions) -> float | None:
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        result = pool.apply(
            _rss_child,
            (str(package.root.parent.parent), package.name, package.version, variant.id, options),
        )
    return float(result)


class _Subject:
    """One variant under measurement, with its samples."""

    def __init__(
        self, package: ModelPackage, variant: Variant, options: RuntimeOptions, batch: int
    ) -> None:
        start = time.perf_counter()
        self.variant = variant
        self.session = open_variant(package, variant, options)
        self.load_ms = (time.perf_counter() - start) * 1000
        self.single = _sample_inputs(package, self.session, 1)
        self.raw = self.session.raw_call(self.single)
        self.batch = batch if _batch_allowed(self.session, batch) else None
        self.batched = _sample_inputs(package, self.session, batch) if self.batch else None
        self.agent_ns: list[int] = []
        self.raw_ns: list[int] = []
        self.batch_ns: list[int] = []
        self.iterations = self._calibrate()

    def _calibrate(self, seconds: float = 0.05) -> int:
        start = time.perf_counter()
        count = 0
        while time.perf_counter() - start < seconds:
            self.session.run(self.single)
            self.raw()
            count += 1
        return max(count, 1)

    def round(self, seconds: float) -> None:
        clock = time.perf_counter_ns
        run, raw, single = self.session.run, self.raw, self.single
        iterations = max(20, int(self.iterations * seconds / 0.05))
        for _ in range(iterations):
            t0 = clock()
            run(single)
            t1 = clock()
            raw()
            t2 = clock()
            self.agent_ns.append(t1 - t0)
            self.raw_ns.append(t2 - t1)
        if self.batched is not None:
            for _ in range(max(5, iterations // 40)):
                t0 = clock()
                run(self.batched)
                self.batch_ns.append(clock() - t0)


def run_bench(
    package: ModelPackage,
    variants: Sequence[Variant],
    options: RuntimeOptions,
    settings: BenchSettings = BenchSettings(),
) -> dict[str, Any]:
    """Measure ``variants`` of ``package`` side by side; returns the report as a dict."""
    subjects = [_Subject(package, variant, options, settings.batch) for variant in variants]
    for _ in range(settings.rounds):
        for subject in subjects:
            subject.round(settings.seconds_per_round)

    results = []
    for subject in subjects:
        agent = np.asarray(subject.agent_ns)
        raw = np.asarray(subject.raw_ns)
        stats = percentiles_ms(agent)
        raw_p50_us = float(np.median(raw)) / 1e3
        agent_p50_us = float(np.median(agent)) / 1e3
        entry: dict[str, Any] = {
            "variant": subject.variant.id,
            "format": subject.variant.format,
            "precision": subject.variant.precision,
            "backend": subject.session.backend,
            "device": subject.session.device,
            "load_ms": round(subject.load_ms, 2),
            **stats,
            "throughput_per_s": round(1000.0 / stats["mean_ms"], 1),
            "samples": len(agent),
            "overhead": {
                "raw_p50_us": round(raw_p50_us, 2),
                "agent_p50_us": round(agent_p50_us, 2),
                "added_us": round(agent_p50_us - raw_p50_us, 2),
                "added_percent": round(100 * (agent_p50_us - raw_p50_us) / raw_p50_us, 1),
            },
            "accuracy": _accuracy(package, subject.session),
            "manifest_accuracy": subject.variant.accuracy,
        }
        if subject.batch_ns:
            batch_ms = float(np.median(subject.batch_ns)) / 1e6
            entry["batch"] = subject.batch
            entry["batch_p50_ms"] = round(batch_ms, 4)
            entry["batch_throughput_per_s"] = (
                round(subject.batch / batch_ms * 1000, 1) if subject.batch else None
            )
        entry["peak_rss_mb"] = (
            _measure_rss(package, subject.variant, options) if settings.rss else None
        )
        results.append(entry)

    return {
        "benchmark": "runtime",
        "model": package.name,
        "version": package.version,
        "machine": machine_info(),
        "threads": options.threads,
        "settings": vars(settings),
        "variants": results,
        "int8_vs_fp32": _int8_vs_fp32(results),
        "targets": {
            "overhead_us_p50": OVERHEAD_TARGET_US,
            "int8_speedup": INT8_SPEEDUP_TARGET,
            "int8_accuracy_loss_points": INT8_ACCURACY_TARGET_POINTS,
        },
    }


def _int8_vs_fp32(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_id = {r["variant"]: r for r in results}
    comparisons = []
    for fmt in ("onnx", "tflite"):
        fp32, int8 = by_id.get(f"{fmt}-fp32"), by_id.get(f"{fmt}-int8")
        if fp32 is None or int8 is None:
            continue
        entry: dict[str, Any] = {
            "format": fmt,
            "speedup_p50": round(fp32["p50_ms"] / int8["p50_ms"], 2),
        }
        if "batch_p50_ms" in fp32 and "batch_p50_ms" in int8:
            entry["speedup_batch"] = round(fp32["batch_p50_ms"] / int8["batch_p50_ms"], 2)
        if fp32["accuracy"] is not None and int8["accuracy"] is not None:
            entry["accuracy_fp32"] = fp32["accuracy"]
            entry["accuracy_int8"] = int8["accuracy"]
            entry["accuracy_delta_points"] = round(100 * (int8["accuracy"] - fp32["accuracy"]), 2)
        comparisons.append(entry)
    return comparisons


def kept_on_device(models: Sequence[str]) -> PolicyRules:
    """The shipped policy, with the ``models`` it names placed on the device."""
    from edge_agent.agent import DEFAULT_POLICY
    from edge_agent.policy import ModelRule, load_policy

    rules = load_policy(DEFAULT_POLICY)
    if not models:
        return rules
    device = ModelRule(placement="device")
    return replace(rules, models={**rules.models, **dict.fromkeys(models, device)})


def quiet_agent(
    profile: DeviceProfile,
    repository: ModelRepository,
    rules: PolicyRules,
    offload: OffloadClient | None = None,
) -> Agent:
    """An agent under ``rules`` on a quiet device: this shared machine's load, which
    would send work away, is not what is measured."""
    from edge_agent.agent import Agent
    from edge_agent.profiles.state import DeviceState

    return Agent(
        profile=profile,
        repository=repository,
        rules=rules,
        offload=offload,
        device_state=lambda: DeviceState(),
    )


def run_agent_path(
    profile: DeviceProfile,
    repository: ModelRepository,
    model: str,
    settings: BenchSettings = BenchSettings(),
) -> dict[str, Any]:
    """The whole ``Agent.infer`` path against the bare library call on the agent's
    own session, alternating call by call.

    Under the shipped policy (for digits-light: the decision, the run, the
    confidence check and the second decision of an escalation that is not
    needed), on a row the device answers itself (no gateway is configured), with
    a quiet device state (this shared machine's load would send work away). A
    model the policy places in the cloud is kept on the device for this. The
    privacy inspection, which runs only when a request is to leave the device,
    is not on this path.
    """
    placement = kept_on_device(()).rule(model).placement
    kept = (model,) if placement == "cloud" else ()
    agent = quiet_agent(profile, repository, kept_on_device(kept))
    try:
        local = agent.local_model(model)
        single = _answered_locally(agent, model, local.package, local.session)
        raw = local.session.raw_call(single)
        clock = time.perf_counter_ns
        agent_ns, raw_ns = [], []
        for round_index in range(settings.rounds + 1):  # the first round warms up
            end = time.perf_counter() + settings.seconds_per_round
            while time.perf_counter() < end:
                t0 = clock()
                agent.infer(model, single)
                t1 = clock()
                raw()
                t2 = clock()
                if round_index:
                    agent_ns.append(t1 - t0)
                    raw_ns.append(t2 - t1)
    finally:
        agent.close()
    raw_p50_us = float(np.median(raw_ns)) / 1e3
    agent_p50_us = float(np.median(agent_ns)) / 1e3
    return {
        "variant": local.variant.id,
        "policy": "the shipped policy"
        + ("" if placement != "cloud" else ", the model kept on the device"),
        "samples": len(agent_ns),
        "raw_p50_us": round(raw_p50_us, 2),
        "agent_p50_us": round(agent_p50_us, 2),
        "added_us": round(agent_p50_us - raw_p50_us, 2),
    }


def _answered_locally(
    agent: Any, model: str, package: ModelPackage, session: Session
) -> dict[str, np.ndarray[Any, Any]]:
    """A one-row input that the agent answers on the device, undegraded: one its
    model is sure of, so that no escalation is wanted."""
    candidates = _sample_inputs(package, session, 64 if _batch_allowed(session, 64) else 1)
    rows = len(next(iter(candidates.values())))
    for index in range(rows):
        single = {name: array[index : index + 1] for name, array in candidates.items()}
        result = agent.infer(model, single)
        if result.where == "device" and not result.degraded:
            return single
    raise RuntimeError(f"none of {rows} inputs was answered on the device by {model}")


def format_report(report: dict[str, Any]) -> str:
    rows = []
    for r in report["variants"]:
        rows.append(
            [
                r["variant"],
                r["p50_ms"],
                r["p95_ms"],
                r["p99_ms"],
                r["throughput_per_s"],
                r.get("batch_throughput_per_s"),
                r["overhead"]["raw_p50_us"],
                r["overhead"]["added_us"],
                r["peak_rss_mb"],
                None if r["accuracy"] is None else round(100 * r["accuracy"], 2),
            ]
        )
    batch = next((r.get("batch") for r in report["variants"] if r.get("batch")), None)
    headers = [
        "variant",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "items/s b1",
        f"items/s b{batch}" if batch else "items/s batch",
        "raw p50 µs",
        "added µs",
        "peak RSS MB",
        "accuracy %",
    ]
    lines = [
        f"{report['model']} v{report['version']}  ({report['machine']['machine']}, "
        f"{report['machine']['cpus']} CPUs, threads={report['threads']})",
        render_table(headers, rows),
    ]
    for c in report["int8_vs_fp32"]:
        text = f"INT8 vs FP32 ({c['format']}): {c['speedup_p50']}x at batch 1"
        if "speedup_batch" in c:
            text += f", {c['speedup_batch']}x at batch {batch}"
        if "accuracy_delta_points" in c:
            text += f"; accuracy {c['accuracy_delta_points']:+.2f} points"
        lines.append(text)
    worst = max((r["overhead"]["added_us"] for r in report["variants"]), default=0.0)
    lines.append(
        f"session overhead over the raw runtime call: at most {worst:.1f} µs at p50 "
        f"(target <= {OVERHEAD_TARGET_US:.0f} µs)"
    )
    path = report.get("agent_path")
    if path is not None:
        lines.append(
            f"Agent.infer ({path['variant']}, the profile's choice, under {path['policy']}) "
            f"over the raw call on its session: +{path['added_us']:.1f} µs at p50 "
            f"({path['raw_p50_us']:.1f} -> {path['agent_p50_us']:.1f} µs; "
            f"target <= {OVERHEAD_TARGET_US:.0f} µs)"
        )
    return "\n".join(lines)
