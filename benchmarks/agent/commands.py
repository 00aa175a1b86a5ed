"""The device's benchmarks as commands of ``python -m benchmarks``: ``hybrid``,
``offload``, ``ota``, ``mqtt``, ``service``, ``privacy``, ``stream``.

Each starts what it measures on loopback (a gateway, a broker, the daemon), prints a
table and writes its report as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from edge_agent.cli.common import CliError, add_model_dir, add_profiles_dir, resolve_profile
from edge_core.paths import default_model_dir
from edge_core.report import publish
from edge_core.repository import ModelRepository

__all__ = ["register"]


def register(commands: Any) -> None:
    hybrid = _add(commands, "hybrid", "local-only, cloud-only and hybrid on the digits", _hybrid)
    hybrid.add_argument("--deadline-ms", type=float, default=250.0, help="per request")
    offload = _add(commands, "offload", "an offload round trip over the floor", _offload)
    _add_requests(offload, 1000)
    offload.add_argument(
        "--link",
        metavar="MBITS",
        help="instead: pictures offloaded over a shaped link at these rates, e.g. 10,25,100 "
        "(as root: a network namespace of its own)",
    )
    offload.add_argument("--rtt-ms", type=float, default=40.0, help="with --link: round trip")
    offload.add_argument(
        "--protocol", choices=("grpc", "http"), default="grpc", help="with --link: transport"
    )
    ota = _add(
        commands,
        "ota",
        "publish and install large models over loopback",
        _ota,
        profile=False,
        models=False,
    )
    ota.add_argument("--sizes", default="50,200", help="model sizes in MB (default: 50,200)")
    mqtt = _add(
        commands,
        "mqtt",
        "telemetry and offload round trips through Mosquitto",
        _mqtt,
        profile=False,
    )
    mqtt.add_argument("--messages", type=int, default=5000, help="telemetry messages")
    _add_requests(mqtt, 300)
    service = _add(
        commands,
        "service",
        "what edge-agent run costs, run as systemd does",
        _service,
        profile=False,
    )
    _add_requests(service, 300)
    service.add_argument("--soak-s", type=float, default=300.0, help="seconds of mixed load")
    service.add_argument("--starts", type=int, default=5, help="daemon starts per configuration")
    privacy = _add(
        commands,
        "privacy",
        "face detectors' recall, and redacting a video",
        _privacy,
        profile=False,
    )
    privacy.add_argument("--quick", action="store_true", help="4 LFW faces, 3 sizes, a 1 s video")
    stream = _add(commands, "stream", "the stream pipeline against a capture loop", _stream)
    stream.add_argument(
        "--models", help="comma-separated models (default: two face detectors and digits-light)"
    )
    stream.add_argument("--clip-s", type=float, default=10.0, help="seconds of clip")
    stream.add_argument("--clip", type=Path, help="a video of your own instead of the written clip")
    stream.add_argument("--key-frames", type=float, default=3.0, help="key-frame threshold, 0..255")


def _add(
    commands: Any,
    name: str,
    summary: str,
    run: Callable[[argparse.Namespace], int],
    *,
    profile: bool = True,
    models: bool = True,
) -> argparse.ArgumentParser:
    """A benchmark's command: ``--json``, and the device profile and the model
    repository where it reads them."""
    parser: argparse.ArgumentParser = commands.add_parser(name, help=summary)
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    if profile:
        parser.add_argument(
            "--profile", help="device profile for threads and providers (default: detected)"
        )
        add_profiles_dir(parser)
    if models:
        add_model_dir(parser)
    parser.set_defaults(run=run)
    return parser


def _add_requests(parser: argparse.ArgumentParser, default: int) -> None:
    parser.add_argument(
        "--requests", type=int, default=default, help=f"round trips each (default: {default})"
    )


def _requests(args: argparse.Namespace) -> int:
    """``--requests``, at least 1."""
    if args.requests < 1:
        raise CliError(f"--requests must be at least 1, got {args.requests}")
    return int(args.requests)


def _done(args: argparse.Namespace, report: dict[str, Any], table: str) -> int:
    """Print the table; write the report as JSON when asked."""
    publish(table, report, args.json)
    return 0


def _hybrid(args: argparse.Namespace) -> int:
    from benchmarks.agent.hybrid import format_hybrid, run_hybrid

    profile, _ = resolve_profile(args)
    report = run_hybrid(
        profile, args.model_dir or default_model_dir(), deadline_ms=args.deadline_ms
    )
    return _done(args, report, format_hybrid(report))


def _offload(args: argparse.Namespace) -> int:
    from benchmarks.agent.offload import format_offload, run_offload

    if args.link:
        return _link(args)
    profile, _ = resolve_profile(args)
    report = run_offload(profile, args.model_dir or default_model_dir(), requests=_requests(args))
    return _done(args, report, format_offload(report))


def _link(args: argparse.Namespace) -> int:
    from benchmarks.agent.link import LinkSettings, format_link, run_link

    try:
        rates = tuple(float(rate) for rate in args.link.split(","))
    except ValueError:
        raise CliError(f"--link takes rates in Mbit/s, e.g. 10,25,100; got {args.link!r}") from None
    if not rates or min(rates) <= 0 or args.rtt_ms < 0:
        raise CliError("--link rates must be positive, and --rtt-ms not negative")
    settings = LinkSettings(rates_mbit=rates, rtt_ms=args.rtt_ms, protocol=args.protocol)
    profile, _ = resolve_profile(args)
    report = run_link(profile, args.model_dir or default_model_dir(), settings)
    return _done(args, report, format_link(report))


def _ota(args: argparse.Namespace) -> int:
    from benchmarks.agent.ota import format_ota, run_ota

    report = run_ota(tuple(int(s) for s in args.sizes.split(",")))
    return _done(args, report, format_ota(report))


def _mqtt(args: argparse.Namespace) -> int:
    from benchmarks.agent.mqtt import format_mqtt, run_mqtt

    report = run_mqtt(
        args.model_dir or default_model_dir(), messages=args.messages, requests=_requests(args)
    )
    return _done(args, report, format_mqtt(report))


def _service(args: argparse.Namespace) -> int:
    from benchmarks.agent.service import ServiceSettings, run_service
    from benchmarks.agent.service_report import format_service

    settings = ServiceSettings(requests=_requests(args), soak_s=args.soak_s, starts=args.starts)
    report = run_service(args.model_dir or default_model_dir(), settings)
    return _done(args, report, format_service(report))


def _privacy(args: argparse.Namespace) -> int:
    from benchmarks.agent.faces import format_privacy, run_faces
    from benchmarks.agent.privacy_video import run_video
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
    from benchmarks.agent.stream import StreamBenchSettings, format_stream, run_stream

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
