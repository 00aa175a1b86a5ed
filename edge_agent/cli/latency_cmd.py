"""``edge-agent bench --model M``: a model's latency on this device, each variant
(:mod:`edge_agent.latency`); prints a table and writes JSON."""

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

__all__ = ["register"]


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "bench",
        help="a model's latency, throughput, memory and accuracy on this device",
        epilog="The project's comparative benchmarks (hybrid, offload, ota, mqtt, service, "
        "privacy, stream) run from a checkout: python -m benchmarks --help.",
    )
    parser.add_argument("--model", help="model name (required)")
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
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    add_model_dir(parser)
    add_profiles_dir(parser)
    parser.set_defaults(run=_bench)


def _bench(args: argparse.Namespace) -> int:
    from edge_agent.latency import BenchSettings, format_report, run_agent_path, run_bench

    if not args.model:
        raise CliError("edge-agent bench needs --model NAME")
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
    publish(format_report(report), report, args.json)
    return 0
