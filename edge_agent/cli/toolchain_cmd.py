"""``edge-agent models inspect`` and ``edge-agent models build`` (the model toolchain).

The toolchain (:mod:`edge_agent.toolchain`: ``onnx``, ``onnxruntime.quantization``)
is imported when one of these commands runs, never by the other commands.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.cli.common import CliError, add_profiles_dir, print_json, profile_store
from edge_agent.profiles import DeviceProfile
from edge_core.errors import PackageError
from edge_core.fields import load_document
from edge_core.package import MANIFEST, PRECISIONS, TASKS, Variant
from edge_core.report import write_json

if TYPE_CHECKING:
    from edge_agent.toolchain.verify import BuildTolerance
    from edge_core.package import ImagePreprocessing

__all__ = ["register"]


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, _, dims = text.partition("=")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=D,D,..., got {text!r}") from None
    if not name or not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME=D,D,... of positive sizes, got {text!r}")
    return name, shape


def register(models: Any) -> None:
    """Add ``inspect`` and ``build`` to the ``models`` sub-commands."""
    inspect = models.add_parser(
        "inspect", help="FLOPs, parameters, memory of a model file or package; predicted latency"
    )
    inspect.add_argument("path", type=Path, help="an .onnx or .tflite file, or a package folder")
    inspect.add_argument("--batch", type=int, default=1, help="batch size to count at (1)")
    inspect.add_argument(
        "--shape", type=_shape, action="append", default=[], metavar="NAME=D,D,...",
        help="an input's full shape, for dynamic sizes other than the batch",
    )  # fmt: skip
    inspect.add_argument("--profile", help="predict the latency on this device profile")
    add_profiles_dir(inspect)
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.set_defaults(run=_inspect)

    build = models.add_parser(
        "build", help="optimize, quantize, verify and benchmark a model into a package"
    )
    build.add_argument("source", type=Path, help="an .onnx or .tflite file, or a package folder")
    build.add_argument("--name", required=True, help="the package's model name")
    build.add_argument("--version", type=int, default=1, help="the package's version (1)")
    build.add_argument("--out", type=Path, required=True, help="the model repository to write")
    build.add_argument("--calibration", type=Path, help="a folder of images, or an .npz")
    build.add_argument("--eval", type=Path, help="an .npz of inputs (and labels), or images")
    build.add_argument("--calibration-count", type=int, default=64, help="items used (64)")
    build.add_argument("--eval-count", type=int, help="items used (all)")
    build.add_argument("--preprocessing", type=Path, help="a TOML file: how images become input")
    build.add_argument("--task", choices=TASKS, help="the model's task (verification follows it)")
    build.add_argument("--labels", type=Path, help="a text file of class names, one a line")
    build.add_argument("--precision", action="append", choices=PRECISIONS,
                       help="variants to build (repeatable; default: all)")  # fmt: skip
    build.add_argument("--method", action="append", choices=["MinMax", "Entropy", "Percentile"],
                       help="INT8 calibration methods to try (default: all)")  # fmt: skip
    tolerance = build.add_argument_group("tolerance (a variant outside it is left out)")
    tolerance.add_argument("--min-agreement", type=float, default=0.99,
                           help="classifiers: top-1 agreement with FP32 (0.99)")  # fmt: skip
    tolerance.add_argument("--min-class-agreement", type=float, default=0.9,
                           help="classifiers: the worst class's agreement (0.9)")  # fmt: skip
    tolerance.add_argument("--max-accuracy-drop", type=float, default=1.0,
                           help="classifiers with labels: points of accuracy (1.0)")  # fmt: skip
    tolerance.add_argument("--min-iou", type=float, default=0.9,
                           help="segmentation: IoU of the thresholded maps (0.9)")  # fmt: skip
    tolerance.add_argument("--threshold", type=float, default=0.3,
                           help="segmentation: the map's threshold (0.3)")  # fmt: skip
    tolerance.add_argument("--max-relative-error", type=float, default=0.05,
                           help="other tasks: mean error over mean magnitude (0.05)")  # fmt: skip
    build.add_argument("--no-fp16-guard", action="store_true",
                       help="convert every operator to FP16, even near the FP16 range")  # fmt: skip
    build.add_argument("--no-bench", action="store_true", help="measure no latency")
    build.add_argument("--bench-seconds", type=float, default=1.0,
                       help="seconds of measurement per variant (1.0)")  # fmt: skip
    build.add_argument("--threads", type=int, help="threads for the measurement")
    build.add_argument("--profile", help="predict latencies on this profile (default: detected)")
    add_profiles_dir(build)
    build.add_argument("--description", default="")
    build.add_argument("--license", default="")
    build.add_argument("--force", action="store_true", help="replace an existing version")
    build.add_argument("--json", type=Path, help="write the build's report as JSON")
    build.set_defaults(run=_build)


def _profile(args: argparse.Namespace) -> DeviceProfile | None:
    if not args.profile:
        return None
    return profile_store(args).get(args.profile)


def _inspect(args: argparse.Namespace) -> int:
    from edge_agent.profiles.cost import predict_ms
    from edge_agent.toolchain.build import figures_of
    from edge_agent.toolchain.figures import format_figures

    profile = _profile(args)
    shapes = dict(args.shape)
    entries: list[tuple[str, str, bytes, Variant | None]] = []
    if args.path.is_dir():
        from edge_core.manifest import load_package

        package = load_package(args.path)
        if package.golden_file is not None and not shapes:
            shapes = {k: (args.batch, *v.shape[1:]) for k, v in package.golden().inputs.items()}
        for known in package.variants:
            entries.append((known.id, known.format, package.read_variant(known), known))
    elif args.path.suffix in (".onnx", ".tflite"):
        try:
            data = args.path.read_bytes()
        except OSError as exc:
            raise CliError(f"cannot read {args.path}: {exc.strerror}") from exc
        entries.append((args.path.name, args.path.suffix[1:], data, None))
    else:
        raise CliError(f"{args.path}: expected an .onnx or .tflite file, or a package folder")
    out = []
    for label, fmt, data, variant in entries:
        figures = figures_of(fmt, data, shapes, batch=args.batch)
        entry: dict[str, Any] = {"model": label, **figures.to_dict()}
        lines = []
        if profile is not None and profile.cost is not None:
            predicted = round(predict_ms(figures.cost(), profile.cost), 3)
            entry["predicted_ms"] = {profile.id: predicted}
            lines.append(("predicted", f"{predicted:g} ms at batch {args.batch} on {profile.id}"))
        elif profile is not None:
            lines.append(("predicted", f"- (profile {profile.id} has no [cost] figures)"))
        if variant is not None and variant.benchmark:
            bench = variant.benchmark
            lines.append(("measured", f"{bench.get('p50_ms')} ms p50 at batch 1 when built"))
        out.append(entry)
        if not args.json:
            print(f"== {label}")
            print(format_figures(figures, lines))
            print()
    if args.json:
        print_json(out if len(out) > 1 else out[0])
    return 0


def _labels(path: Path | None) -> tuple[str, ...] | None:
    if path is None:
        return None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from exc
    return tuple(line.strip() for line in lines if line.strip())


def _command_line() -> str:
    """This build's command, as a person would type it again (without ``--json FILE``)."""
    import shlex
    import sys

    words = sys.argv[1:]
    if "--json" in words:
        at = words.index("--json")
        words = words[:at] + words[at + 2 :]
    return shlex.join(["edge-agent", *words])


def _build(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from edge_agent.profiles import resolve_profile
    from edge_agent.toolchain.build import BuildRequest, build_package
    from edge_agent.toolchain.measure import MeasureSettings
    from edge_agent.toolchain.report import format_build

    here, _ = resolve_profile(None, profiles_dir=args.profiles_dir)
    profile = _profile(args) or here
    options = replace(here.runtime, warmup=max(here.runtime.warmup, 3))
    if args.threads is not None:
        options = replace(options, threads=args.threads)
    preprocessing = _preprocessing(args)
    seconds = args.bench_seconds
    request = BuildRequest(
        source=args.source,
        name=args.name,
        version=args.version,
        out=args.out,
        calibration=args.calibration,
        evaluation=args.eval,
        preprocessing=preprocessing,
        task=args.task,
        labels=_labels(args.labels),
        precisions=tuple(args.precision or PRECISIONS),
        methods=tuple(args.method or ("MinMax", "Entropy", "Percentile")),
        tolerance=_tolerance(args),
        calibration_count=args.calibration_count,
        evaluation_count=args.eval_count,
        fp16_guard=not args.no_fp16_guard,
        bench=None if args.no_bench else MeasureSettings(5, seconds / 5),
        options=options,
        profile=profile,
        description=args.description,
        license=args.license,
        force=args.force,
    )
    if args.source.is_dir() and not (args.source / MANIFEST).is_file():
        raise PackageError(f"{args.source} is not a package (no {MANIFEST})")
    report = build_package(request)
    report["command"] = _command_line()
    print(format_build(report))
    if args.json is not None:
        write_json(args.json, report)
    return 0


def _preprocessing(args: argparse.Namespace) -> ImagePreprocessing | None:
    """``--preprocessing``'s table, checked against the source's inputs (``None``
    without it)."""
    from edge_core.manifest import load_package, parse_preprocessing
    from edge_core.package import ManifestError
    from edge_core.runtime import open_model

    if args.preprocessing is None:
        return None
    if args.source.is_dir():
        inputs = load_package(args.source).inputs
    else:
        fmt = args.source.suffix.lstrip(".")
        try:
            inputs = open_model(fmt, args.source.read_bytes()).inputs
        except (OSError, ValueError) as exc:
            raise CliError(f"cannot open {args.source}: {exc}") from exc
    document = load_document(args.preprocessing, ManifestError)
    return parse_preprocessing(document, inputs, args.preprocessing)


def _tolerance(args: argparse.Namespace) -> BuildTolerance:
    """How far a variant may stray from its source, from the command's options."""
    from edge_agent.toolchain.verify import BuildTolerance

    return BuildTolerance(
        min_agreement=args.min_agreement,
        min_class_agreement=args.min_class_agreement,
        max_accuracy_drop_points=args.max_accuracy_drop,
        min_iou=args.min_iou,
        threshold=args.threshold,
        max_relative_error=args.max_relative_error,
    )
