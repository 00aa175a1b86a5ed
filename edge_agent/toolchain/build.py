"""``edge-agent models build``: from a model file (or a package) to a package a device runs.

1. The source: an ONNX file, a TFLite file (packaged as it is: converting to
   TFLite needs TensorFlow, which the build never does) or a package folder
   (its FP32 ONNX variant, preprocessing, labels and held-out data).
2. The data: calibration items (images preprocessed as the package says, or
   arrays) and evaluation items, with labels when known; without evaluation
   data the calibration data verifies.
3. The variants of an ONNX source (:mod:`.convert`): FP32 with ONNX Runtime's
   basic offline optimization; FP16 with the operators near the FP16 range
   kept in FP32; INT8 static QDQ with each calibration method and weights per
   channel, and per tensor with MinMax; dynamic INT8 too for a MatMul-heavy
   model. The INT8 candidate that agrees best with FP32 is kept.
4. Each variant against the source's outputs (:mod:`.verify`): one outside
   the tolerance is left out, with the reason printed.
5. The kept variants measured side by side with the source (:mod:`.measure`),
   their cost counted (:mod:`.figures`) and their latency predicted on the
   device profile (:mod:`edge_agent.profiles.cost`).
6. The package: ``manifest.json`` (tensors, labels, preprocessing, variants
   with SHA-256, size, cost, verification, benchmark and smoke-test
   tolerance), ``golden.npz`` (evaluation inputs and FP32 outputs) and, with
   labels, ``heldout.npz``.

Deterministic: the same source, data and options give the same model files,
``golden.npz`` and ``heldout.npz``; the manifest differs only in what was
measured (the ``benchmark`` of each variant; ``--no-bench`` leaves it out).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.profiles.cost import predict_ms
from edge_agent.profiles.schema import DeviceProfile
from edge_agent.toolchain import convert
from edge_agent.toolchain.data import DataError, Dataset, load_dataset, stack_items, write_npz
from edge_agent.toolchain.figures import ModelFigures
from edge_agent.toolchain.measure import MeasureSettings, measure
from edge_agent.toolchain.verify import BuildTolerance, compare, refusal
from edge_core.errors import EdgeError
from edge_core.manifest import load_package
from edge_core.names import is_model_name
from edge_core.package import ImagePreprocessing, ModelPackage, Tolerance, Variant
from edge_core.report import machine_info
from edge_core.runtime import RuntimeOptions, Session, open_model
from edge_core.tensors import TensorSpec

__all__ = ["BuildError", "BuildRequest", "DataError", "build_package", "figures_of"]

log = logging.getLogger(__name__)

Array = np.ndarray[Any, Any]
INT8_METHODS = ("MinMax", "Entropy", "Percentile")
# Floors of the smoke-test tolerance: a variant's outputs may differ from the golden
# ones by this much on any machine, on top of twice the difference measured here.
TOLERANCE_FLOOR = {"fp32": 1e-4, "fp16": 2e-3, "int8": 1.0 / 64}
MATMUL_OPS = {"MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "FULLY_CONNECTED", "BATCH_MATMUL"}


class BuildError(EdgeError):
    """A build cannot go on: a source, an option or the data is wrong."""


@dataclass(frozen=True)
class BuildRequest:
    """What ``models build`` was asked to do (its command-line options)."""

    source: Path
    name: str
    version: int
    out: Path
    calibration: Path | Dataset | None = None
    evaluation: Path | Dataset | None = None
    preprocessing: ImagePreprocessing | None = None  # overrides the source package's
    task: str | None = None
    labels: tuple[str, ...] | None = None
    precisions: tuple[str, ...] = ("fp32", "fp16", "int8")
    methods: tuple[str, ...] = INT8_METHODS
    tolerance: BuildTolerance = field(default_factory=BuildTolerance)
    calibration_count: int = 64
    evaluation_count: int | None = None
    golden_count: int = 8
    fp16_guard: bool = True
    bench: MeasureSettings | None = field(default_factory=MeasureSettings)
    options: RuntimeOptions = field(default_factory=lambda: RuntimeOptions(warmup=3))
    profile: DeviceProfile | None = None
    description: str = ""
    license: str = ""
    source_note: str = ""  # where the model comes from, for the manifest's ``source``
    evaluation_note: dict[str, Any] = field(default_factory=dict)  # data set, split, metric
    force: bool = False
    # ready-made variants to verify and ship beside the built ones: (format, precision, bytes)
    extra_variants: tuple[tuple[str, str, bytes], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Candidate:
    id: str
    format: str
    precision: str
    data: bytes
    outputs: list[dict[str, Array]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Source:
    format: str
    data: bytes
    package: ModelPackage | None


def _read_source(path: Path) -> _Source:
    if path.is_dir():
        package = load_package(path)
        ranked = sorted(package.variants, key=lambda v: (v.format != "onnx", v.precision != "fp32"))
        variant = ranked[0]
        return _Source(variant.format, package.read_variant(variant), package)
    suffix = path.suffix.lower()
    if suffix not in (".onnx", ".tflite"):
        raise BuildError(f"{path}: expected an .onnx or .tflite file, or a package folder")
    try:
        return _Source(suffix[1:], path.read_bytes(), None)
    except OSError as exc:
        raise BuildError(f"cannot read {path}: {exc.strerror}") from exc


def _dataset(
    value: Path | Dataset | None, session: Session, pre: ImagePreprocessing | None
) -> Dataset | None:
    if value is None or isinstance(value, Dataset):
        return value
    return load_dataset(value, session.inputs, pre)


def run_items(session: Session, items: Sequence[Mapping[str, Array]]) -> list[dict[str, Array]]:
    """``session``'s outputs for each item (consecutive items of one shape run as a batch
    where the batch dimension is dynamic)."""
    dynamic = all(spec.shape and spec.shape[0] < 0 for spec in session.inputs)
    out: list[dict[str, Array]] = []
    start = 0
    while start < len(items):
        end = start + 1
        shapes = {k: v.shape for k, v in items[start].items()}
        while dynamic and end < len(items) and end - start < 32:
            if {k: v.shape for k, v in items[end].items()} != shapes:
                break
            end += 1
        feeds = {k: np.concatenate([items[i][k] for i in range(start, end)]) for k in shapes}
        results = session.run(feeds)
        for row in range(end - start):
            out.append({k: v[row : row + 1] for k, v in results.items()})
        start = end
    return out


def figures_of(
    fmt: str, data: bytes, shapes: Mapping[str, Sequence[int]], *, batch: int = 1
) -> ModelFigures:
    """The figures of a model file at ``batch`` (``shapes``: full input shapes).

    Raises:
        FiguresError: they cannot be counted.
    """
    if fmt == "tflite":
        from edge_agent.toolchain.tflite_graph import tflite_figures

        return tflite_figures(data, batch=batch)
    from edge_agent.toolchain.onnx_graph import onnx_figures

    return onnx_figures(data, batch=batch, shapes=shapes)


def _score(metrics: Mapping[str, Any]) -> tuple[float, ...]:
    """Higher is better: how an INT8 candidate ranks (agreement, then its worst class)."""
    if not metrics.get("finite", False):
        return (-1.0,)
    if "agreement" in metrics:
        return (metrics["agreement"], metrics["class_agreement"][metrics["worst_class"]])
    if "iou" in metrics:
        return (metrics["iou"], -metrics["mean_abs_error"])
    return (-metrics.get("relative_error", metrics["mean_abs_error"]),)


def _int8(
    fp32: bytes, calibration: Dataset, figures: ModelFigures, methods: Sequence[str]
) -> list[_Candidate]:
    items = list(calibration.items)
    configs = [(m, True) for m in methods]
    if "MinMax" in methods:
        configs.append(("MinMax", False))
    out = []
    for method, per_channel in configs:
        label = f"static {method}, weights per {'channel' if per_channel else 'tensor'}"
        data = convert.int8_static(fp32, items, method=method, per_channel=per_channel)
        out.append(_Candidate("onnx-int8", "onnx", "int8", data, info={"int8": label}))
    matmul = sum(op.macs for op in figures.ops if op.op_type in MATMUL_OPS)
    if figures.macs and matmul >= figures.macs / 2:
        data = convert.int8_dynamic(fp32)
        out.append(_Candidate("onnx-int8", "onnx", "int8", data, info={"int8": "dynamic"}))
    return out


@dataclass
class _Build:
    """One build as its stages share it: the request, the source, the data, and the
    source's outputs that every variant is verified against."""

    request: BuildRequest
    root: Path  # the package's folder, written last
    source: _Source
    task: str
    labels: tuple[str, ...]
    pre: ImagePreprocessing | None
    calibration: Dataset | None
    evaluation: Dataset
    reference: list[dict[str, Array]]  # the source's outputs on the evaluation items
    shapes: dict[str, tuple[int, ...]]  # the evaluation items' input shapes
    figures: ModelFigures  # the source's
    say: Any
    info: dict[str, Any] = field(default_factory=dict)  # what was done, for the manifest

    def verify(self, candidate: _Candidate) -> None:
        """Run ``candidate`` on the evaluation items and compare it with the source: a
        variant outside the tolerance gets the reason it is left out."""
        request = self.request
        session = open_model(candidate.format, candidate.data, request.options)
        candidate.outputs = run_items(session, self.evaluation.items)
        candidate.metrics = compare(
            self.task, self.reference, candidate.outputs, self.evaluation.labels, request.tolerance
        )
        candidate.reason = refusal(candidate.metrics, request.tolerance)
        session.close()


def build_package(request: BuildRequest, say: Any = print) -> dict[str, Any]:
    """Build the package that ``request`` describes; returns the build's report.

    The stages of this module's docstring, in order: each variant is made, then
    verified against the source, and only the ones within the tolerance are
    measured and written.

    Raises:
        BuildError, DataError: a source, an option or the data is wrong.
        PackageError: a source package is malformed.
        BackendError: a runtime refused the source.
    """
    build = _prepare(request, say)
    candidates: list[_Candidate] = []
    fp32: bytes | None = None
    if build.source.format == "onnx":
        fp32, candidates = _float_variants(build)
    else:
        candidates = [_tflite_variant(build)]
    for candidate in candidates:
        build.verify(candidate)
        if candidate.reason is None and candidate.info.get("overflow"):
            candidate.reason = candidate.info["overflow"]
    if fp32 is not None and "int8" in request.precisions:
        candidates += _best_int8(build, fp32)
    for fmt, precision, data in request.extra_variants:
        extra = _Candidate(f"{fmt}-{precision}", fmt, precision, data)
        build.verify(extra)
        candidates.append(extra)
    kept, left_out = _within_tolerance(candidates, say)
    report = _write(build, kept, _benchmark(build, kept))
    report["left_out"] = left_out
    return report


def _prepare(request: BuildRequest, say: Any) -> _Build:
    """Stages 1-2: the source and the data, and the source's outputs on the data.

    Raises:
        BuildError: the name is invalid, the version exists already (without
            ``force``), or there is neither calibration nor evaluation data.
    """
    if not is_model_name(request.name):
        raise BuildError(f"{request.name!r} is not a valid model name")
    root = request.out / request.name / str(request.version)
    if root.exists() and not request.force:
        raise BuildError(f"{root} exists already (--force replaces it)")
    source = _read_source(request.source)
    package = source.package
    pre = request.preprocessing or (package.preprocessing if package else None)
    labels = request.labels if request.labels is not None else (package.labels if package else ())
    session = open_model(source.format, source.data, request.options)
    calibration, evaluation = _data(request, source, session, pre)
    say(
        f"evaluation: {evaluation.source}"
        + (f"; calibration: {calibration.source}" if calibration else "")
    )
    shapes = {k: tuple(v.shape) for k, v in evaluation.items[0].items()}
    return _Build(
        request=request,
        root=root,
        source=source,
        task=request.task or (package.task if package else "other"),
        labels=labels,
        pre=pre,
        calibration=calibration,
        evaluation=evaluation,
        reference=run_items(session, evaluation.items),
        shapes=shapes,
        figures=figures_of(source.format, source.data, shapes),
        say=say,
        info={"source": str(request.source), "evaluation": evaluation.source},
    )


def _data(
    request: BuildRequest, source: _Source, session: Session, pre: ImagePreprocessing | None
) -> tuple[Dataset | None, Dataset]:
    """The calibration items (at most ``calibration_count``) and the evaluation items:
    those asked for, else a source package's held-out items, else the calibration items.

    Raises:
        BuildError: there is neither.
    """
    package = source.package
    calibration = _dataset(request.calibration, session, pre)
    evaluation = _dataset(request.evaluation, session, pre)
    if evaluation is None and package is not None and package.evaluation_file is not None:
        inputs, held_labels = package.evaluation()
        name, dtype = package.inputs[0].name, session.inputs[0].dtype
        rows = tuple({name: inputs[i : i + 1].astype(dtype)} for i in range(len(inputs)))
        held = f"{len(inputs)} held-out items of {package.qualified_name}"
        evaluation = Dataset(rows, held_labels, held)
    if calibration is not None:
        calibration = calibration.head(request.calibration_count)
    if evaluation is None:
        evaluation = calibration
    if evaluation is None:
        raise BuildError("give calibration data (--calibration) or evaluation data (--eval)")
    return calibration, evaluation.head(request.evaluation_count)


def _float_variants(build: _Build) -> tuple[bytes, list[_Candidate]]:
    """Stage 3 for an ONNX source: the optimized FP32 model (the base of every other
    variant) and the FP32 and FP16 variants asked for."""
    request, say = build.request, build.say
    fp32 = convert.optimize_fp32(build.source.data)
    nodes = {"before": convert.node_count(build.source.data), "after": convert.node_count(fp32)}
    build.info["optimization"] = {"level": "basic", "nodes": nodes}
    say(f"FP32: ONNX Runtime basic optimization, {nodes['before']} -> {nodes['after']} nodes")
    candidates = []
    if "fp32" in request.precisions:
        candidates.append(_Candidate("onnx-fp32", "onnx", "fp32", fp32))
    if "fp16" in request.precisions:
        candidates.append(_fp16_variant(build, fp32))
    return fp32, candidates


def _fp16_variant(build: _Build, fp32: bytes) -> _Candidate:
    """FP16, with the operators whose tensors come near the FP16 range kept in FP32
    (unless the guard is off); one that would still overflow carries the reason."""
    sample = list((build.calibration or build.evaluation).items[:16])
    data, risks, blocked = convert.fp16(fp32, sample, guard=build.request.fp16_guard)
    fp16_info = {"near_fp16_range": [r.to_dict() for r in risks], "kept_fp32": blocked}
    build.info["fp16"] = fp16_info
    for risk in risks:
        build.say(f"FP16: tensor {risk.tensor} reaches {risk.max_abs:g} (FP16 ends at 65504)")
    if blocked:
        build.say(f"FP16: {len(blocked)} nodes kept in FP32: {', '.join(blocked[:8])}")
    candidate = _Candidate("onnx-fp16", "onnx", "fp16", data, info=fp16_info)
    candidate.info["overflow"] = _overflow(risks, blocked)
    return candidate


def _tflite_variant(build: _Build) -> _Candidate:
    """Stage 3 for a TFLite source: the source itself (converting needs TensorFlow), of
    the precision it computes in."""
    package = build.source.package
    precision = "int8" if build.figures.cost().flops.get("int8") else (
        package.variants[0].precision if package else "fp32")  # fmt: skip
    return _Candidate(f"tflite-{precision}", "tflite", precision, build.source.data)


def _best_int8(build: _Build, fp32: bytes) -> list[_Candidate]:
    """The INT8 candidate that agrees best with FP32, every one tried verified (none
    without calibration data)."""
    if build.calibration is None:
        build.say("INT8: left out: no calibration data (--calibration)")
        return []
    tried = _int8(fp32, build.calibration, build.figures, build.request.methods)
    for candidate in tried:
        build.verify(candidate)
    best = max(tried, key=lambda c: _score(c.metrics))  # the first of equals wins
    build.say(f"INT8: {len(tried)} candidates; kept {best.info['int8']}")
    build.info["int8"] = {
        "chosen": best.info["int8"],
        "tried": [{"config": c.info["int8"], **_summary(c.metrics)} for c in tried],
    }
    return [best]


def _within_tolerance(
    candidates: list[_Candidate], say: Any
) -> tuple[list[_Candidate], list[dict[str, Any]]]:
    """Stage 4: the variants kept, and those left out with their reason.

    Raises:
        BuildError: none is kept.
    """
    kept, left_out = [], []
    for candidate in candidates:
        if candidate.reason is not None:
            say(f"{candidate.id}: LEFT OUT: {candidate.reason}")
            left_out.append({"variant": candidate.id, "reason": candidate.reason,
                             "verification": _summary(candidate.metrics)})  # fmt: skip
        else:
            kept.append(candidate)
    if not kept:
        raise BuildError("no variant is within the tolerance: nothing to package")
    return kept, left_out


def _benchmark(build: _Build, kept: list[_Candidate]) -> dict[str, dict[str, Any]]:
    """Stage 5: the kept variants measured side by side with the source (none asked for:
    nothing)."""
    request, source = build.request, build.source
    if request.bench is None:
        return {}
    subjects = {"source": (source.format, source.data)} | {c.id: (c.format, c.data) for c in kept}
    return measure(subjects, build.evaluation.items[0], request.options, request.bench)


def _overflow(risks: Sequence[convert.RangeFinding], blocked: Sequence[str]) -> str | None:
    """Why an FP16 variant overflows: a tensor past the FP16 range that an FP16
    operator makes or reads. Its outputs here may not show it: ONNX Runtime's CPU
    computes most FP16 operators in FP32; a GPU or an ARM core with FP16
    arithmetic does not."""
    kept = set(blocked)
    for risk in risks:
        nodes = {risk.producer, *risk.consumers} - {""}
        if risk.max_abs > convert.FP16_MAX and not nodes <= kept:
            return (
                f"FP16 overflow: tensor {risk.tensor} reaches {risk.max_abs:g}, past FP16's "
                f"{convert.FP16_MAX:g}, in FP16 operators ({', '.join(sorted(nodes - kept))})"
            )
    return None


def _summary(metrics: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("agreement", "accuracy", "iou", "relative_error", "mean_abs_error", "finite")
    return {k: metrics[k] for k in keep if k in metrics}


def _write(
    build: _Build, kept: list[_Candidate], benchmark: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """Stage 6: the package (model files, golden and held-out data, the manifest) in
    place of any earlier one; returns the build's report."""
    request, root, evaluation = build.request, build.root, build.evaluation
    chosen, golden_inputs = stack_items(evaluation.items, max(1, request.golden_count))
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    fp32_ms = benchmark.get(next((c.id for c in kept if c.precision == "fp32"), ""), {}).get(
        "p50_ms"
    )
    written = [_write_variant(build, c, chosen, benchmark.get(c.id), fp32_ms) for c in kept]
    golden = {f"input:{k}": v for k, v in golden_inputs.items()}
    golden.update(
        {
            f"output:{name}": np.concatenate([build.reference[i][name] for i in chosen])
            for name in build.reference[0]
        }
    )
    write_npz(root / "golden.npz", golden)
    heldout = _write_heldout(root, evaluation)
    _manifest(build, kept[0], tuple(v for v, _ in written), heldout).write_manifest()
    build.say(f"wrote {root}")
    return {
        "benchmark": "build",
        "model": request.name,
        "version": request.version,
        "machine": machine_info(),
        "profile": request.profile.id if request.profile is not None else None,
        "build": build.info,
        "input_shape": list(next(iter(build.shapes.values()))),
        "source_p50_ms": benchmark.get("source", {}).get("p50_ms"),
        "variants": [row for _, row in written],
    }


def _write_variant(
    build: _Build,
    candidate: _Candidate,
    chosen: Sequence[int],
    measured: dict[str, Any] | None,
    fp32_ms: float | None,
) -> tuple[Variant, dict[str, Any]]:
    """One kept variant's file, its manifest entry and its row of the report. Its
    smoke-test tolerance is twice its largest difference from the golden outputs here,
    and never below its precision's floor."""
    request, reference = build.request, build.reference
    file = f"model.{candidate.precision}.{candidate.format}"
    (build.root / file).write_bytes(candidate.data)
    worst = max(
        float(np.max(np.abs(candidate.outputs[i][n] - reference[i][n]), initial=0.0))
        for i in chosen for n in reference[0]
    )  # fmt: skip
    cost = figures_of(candidate.format, candidate.data, build.shapes).cost()
    predicted = None
    if request.profile is not None and request.profile.cost is not None:
        predicted = round(predict_ms(cost, request.profile.cost), 3)
    bench = None
    if measured is not None:
        bench = dict(measured)
        if fp32_ms:
            bench["speedup_vs_fp32"] = round(fp32_ms / measured["p50_ms"], 2)
    variant = Variant(
        id=candidate.id,
        format=candidate.format,
        precision=candidate.precision,
        file=file,
        sha256=hashlib.sha256(candidate.data).hexdigest(),
        size=len(candidate.data),
        accuracy=candidate.metrics.get("accuracy"),
        tolerance=Tolerance(atol=max(TOLERANCE_FLOOR[candidate.precision],
                                     round(2 * worst, 6)), rtol=0.0),
        cost=cost,
        verification={**candidate.metrics, **candidate.info},
        benchmark=bench,
    )  # fmt: skip
    nodes = convert.node_count(candidate.data) if candidate.format == "onnx" else cost.nodes
    row = {"variant": candidate.id, "nodes": nodes, "cost": cost.to_dict(),
           "verification": _summary(candidate.metrics),
           "benchmark": bench, "predicted_ms": predicted}  # fmt: skip
    return variant, row


def _write_heldout(root: Path, evaluation: Dataset) -> str | None:
    """``heldout.npz`` (inputs and labels) when the evaluation items are labelled and of
    one input; its file name, or ``None``."""
    if evaluation.labels is None or len(evaluation.items[0]) != 1:
        return None
    name = next(iter(evaluation.items[0]))
    _, stacked = stack_items(evaluation.items, len(evaluation.items))
    if len(stacked[name]) != len(evaluation.labels):
        return None
    write_npz(root / "heldout.npz", {"inputs": stacked[name], "labels": evaluation.labels})
    return "heldout.npz"


def _manifest(
    build: _Build, first: _Candidate, variants: tuple[Variant, ...], heldout: str | None
) -> ModelPackage:
    """The built package: what the request says, else what the source package said."""
    request, package = build.request, build.source.package
    return ModelPackage(
        root=build.root,
        name=request.name,
        version=request.version,
        task=build.task,
        description=request.description or (package.description if package else ""),
        inputs=_specs(first, "inputs", request.options),
        outputs=_specs(first, "outputs", request.options),
        variants=variants,
        labels=build.labels,
        preprocessing=build.pre,
        golden_file="golden.npz",
        evaluation_file=heldout,
        source=request.source_note
        or (package.source if package and package.source else str(request.source.name)),
        license=request.license or (package.license if package else ""),
        extra=_extra(request, build.info, heldout),
    )


def _extra(request: BuildRequest, info: dict[str, Any], heldout: str | None) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "build": {**info, "tolerance": request.tolerance.to_dict(), **request.extra}
    }
    if heldout is not None and request.evaluation_note:
        extra["evaluation"] = dict(request.evaluation_note)
    return extra


def _specs(candidate: _Candidate, what: str, options: RuntimeOptions) -> Any:
    session = open_model(candidate.format, candidate.data, options)
    specs = session.inputs if what == "inputs" else session.outputs
    return tuple(TensorSpec(spec.name, spec.datatype, spec.shape) for spec in specs)
