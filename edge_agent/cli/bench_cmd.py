"""``edge-agent bench``: benchmarks that print a table and write JSON."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from edge_agent.cli.common import CliError, add_model_dir, add_profiles_dir, resolve_profile
from edge_core.paths import default_model_dir
from edge_core.report import publish
from edge_core.repository import ModelRepository
from edge_core.runtime import installed_formats

SUITES = ("runtime", "hybrid", "offload", "ota", "mqtt", "service", "privacy", "stream")


def register(commands: Any) -> None:
    parser = commands.add_parser("bench", help="benchmarks (print a table, write JSON)")
    parser.add_argument(
        "suite", nargs="?", choices=SUITES, default="runtime", help="what to measure"
    )
    parser.add_argument("--model", help="model name (runtime suite)")
    parser.add_argument("--version", type=int, help="model version (default: the newest)")
    parser.add_argument(
        "--variant", action="append", help="variant id to measure (repeatable; default: all)"
    )
    parser.add_argument(
        "--profile", help="device profile for threads and providers (default: detected)"
    )
    parser.add_argument("--threads", type=int, help="override the profile's thread count")
    parser.add_argument("--rounds", type=int, default=5, help="measurement rounds (default: 5)")
    parser.add_argument("--seconds", type=float, default=0.3, help="seconds per variant and round")
    parser.add_argument(
        "--batch", type=int, default=32, help="batch size for the batched throughput"
    )
    parser.add_argument("--no-rss", action="store_true", help="skip the per-variant peak RSS runs")
    parser.add_argument("--deadline-ms", type=float, default=250.0, help="per request (hybrid)")
    parser.add_argument("--sizes", default="50,200", help="model sizes in MB (ota)")
    parser.add_argument("--messages", type=int, default=5000, help="telemetry messages (mqtt)")
    parser.add_argument(
        "--requests", type=int, help="round trips each (mqtt, service: 300; offload: 1000)"
    )
    parser.add_argument(
        "--soak-s", type=float, default=300.0, help="seconds of mixed load (service)"
    )
    parser.add_argument(
        "--starts", type=int, default=5, help="daemon starts per configuration (service)"
    )
    parser.add_argument(
        "--models",
        help="comma-separated models (stream; default: two face detectors and digits-light)",
    )
    parser.add_argument("--clip-s", type=float, default=10.0, help="seconds of clip (stream)")
    parser.add_argument(
        "--clip", type=Path, help="a video of your own instead of the written clip (stream)"
    )
    parser.add_argument(
        "--key-frames", type=float, default=3.0, help="key-frame threshold, 0..255 (stream)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="privacy: 4 LFW faces, 3 sizes, a 1 s video"
    )
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    add_model_dir(parser)
    add_profiles_dir(parser)
    parser.set_defaults(run=_bench)


def _bench(args: argparse.Namespace) -> int:
    if args.suite == "hybrid":
        return _hybrid(args)
    if args.suite == "offload":
        return _offload(args)
    if args.suite == "ota":
        return _ota(args)
    if args.suite == "mqtt":
        return _mqtt(args)
    if args.suite == "service":
        return _service(args)
    if args.suite == "privacy":
        return _privacy(args)
    if args.suite == "stream":
        return _stream(args)
    return _runtime(args)


def _requests(args: argparse.Namespace, default: int) -> int:
    """``--requests``, or the suite's default; at least 1."""
    requests = default if args.requests is None else int(args.requests)
    if requests < 1:
        raise CliError(f"--requests must be at least 1, got {requests}")
    return requests


def _done(args: argparse.Namespace, report: dict[str, Any], table: str) -> int:
    """Print the table; write the report as JSON when asked."""
    publish(table, report, args.json)
    return 0


def _hybrid(args: argparse.Namespace) -> int:
    from edge_agent.bench.hybrid import format_hybrid, run_hybrid

    profile, _ = resolve_profile(args)
    report = run_hybrid(
        profile, args.model_dir or default_model_dir(), deadline_ms=args.deadline_ms
    )
    return _done(args, report, format_hybrid(report))


def _offload(args: argparse.Namespace) -> int:
    from edge_agent.bench.offload import format_offload, run_offload

    profile, _ = resolve_profile(args)
    report = run_offload(
        profile, args.model_dir or default_model_dir(), requests=_requests(args, 1000)
    )
    return _done(args, report, format_offload(report))


def _ota(args: argparse.Namespace) -> int:
    from edge_agent.bench.ota import format_ota, run_ota

    report = run_ota(tuple(int(s) for s in args.sizes.split(",")))
    return _done(args, report, format_ota(report))


def _mqtt(args: argparse.Namespace) -> int:
    from edge_agent.bench.mqtt import format_mqtt, run_mqtt

    report = run_mqtt(
        args.model_dir or default_model_dir(), messages=args.messages, requests=_requests(args, 300)
    )
    return _done(args, report, format_mqtt(report))


def _service(args: argparse.Namespace) -> int:
    from edge_agent.bench.service import ServiceSettings, run_service
    from edge_agent.bench.service_report import format_service

    settings = ServiceSettings(
        requests=_requests(args, 300), soak_s=args.soak_s, starts=args.starts
    )
    report = run_service(args.model_dir or default_model_dir(), settings)
    return _done(args, report, format_service(report))


def _privacy(args: argparse.Namespace) -> int:
    from edge_agent.bench.faces import format_privacy, run_faces
    from edge_agent.bench.privacy_video import run_video
    from edge_agent.privacy.faces import open_detectors
    from edge_core.report import machine_info
    from edge_core.runtime import RuntimeOptions

    repository = ModelRepository(args.model_dir or default_model_dir())
    if args.quick:
        report = run_faces(repository, lfw=4, sizes=(32, 64, 192))
    else:
        report = run_faces(repository)
    detector, checker = open_detectors(
        repository, options=RuntimeOptions(allow_spinning=False, warmup=2)
    )
    report["video"] = run_video(detector, checker, seconds=1.0 if args.quick else 8.0)
    report["machine"] = machine_info()
    return _done(args, report, format_privacy(report))


def _stream(args: argparse.Namespace) -> int:
    from edge_agent.bench.stream import StreamBenchSettings, format_stream, run_stream

    settings = StreamBenchSettings(clip_s=args.clip_s, key_frames=args.key_frames, clip=args.clip)
    if args.models:
        settings = replace(settings, models=tuple(m.strip() for m in args.models.split(",")))
    if settings.clip_s <= 0:
        raise CliError(f"--clip-s must be positive, got {settings.clip_s}")
    repository = ModelRepository(args.model_dir or default_model_dir())
    for model in settings.models:
        repository.get(model)  # a clear error now, not halfway through
    profile, _ = resolve_profile(args)
    report = run_stream(profile, repository.root, settings)
    return _done(args, report, format_stream(report))


def _runtime(args: argparse.Namespace) -> int:
    from edge_agent.bench.runtime import BenchSettings, format_report, run_agent_path, run_bench

    if not args.model:
        raise CliError("the runtime benchmark needs --model NAME")
    repository = ModelRepository(args.model_dir or default_model_dir())
    package = repository.get(args.model, args.version)
    profile, _ = resolve_profile(args)
    options = profile.runtime
    if args.threads:
        options = replace(options, threads=args.threads)
    if args.variant:
        variants = [package.variant(v) for v in args.variant]
    else:
        installed = installed_formats()
        variants = [v for v in package.variants if v.format in installed]
    settings = BenchSettings(
        rounds=args.rounds, seconds_per_round=args.seconds, batch=args.batch, rss=not args.no_rss
    )
    report = run_bench(package, variants, options, settings)
    report["profile"] = profile.id
    if not (args.threads or args.variant or args.version):  # as the agent would run it
        report["agent_path"] = run_agent_path(profile, repository, package.name, settings)
    return _done(args, report, format_report(report))
