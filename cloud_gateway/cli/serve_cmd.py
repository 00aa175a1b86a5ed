"""``cloud-gateway serve`` and ``cloud-gateway bench``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cloud_gateway.cli.common import config_of
from edge_core.loops import LOOPS, loop_name, run

__all__ = ["register"]


def register(commands: Any) -> None:
    _register_serve(commands)
    _register_bench(commands)


def _register_serve(commands: Any) -> None:
    serve = commands.add_parser("serve", help="serve a model repository")
    serve.add_argument("--repository", type=Path, help="model repository directory")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--http-port", type=int, help="REST port (default 8000)")
    serve.add_argument("--grpc-port", type=int, help="gRPC port (default 8001)")
    serve.add_argument(
        "--loop",
        choices=LOOPS,
        default="auto",
        help="event loop (auto: uvloop where installed, else asyncio's)",
    )
    serve.set_defaults(run=_serve)


def _register_bench(commands: Any) -> None:
    bench = commands.add_parser("bench", help="throughput and latency under concurrent load")
    bench.add_argument("--model", help="default: digits-heavy (with --peers: wide-mlp)")
    bench.add_argument(
        "--repository", type=Path, help="model repository (default: the sample models)"
    )
    bench.add_argument(
        "--variant", help="variant the gateway serves (default: onnx-int8; with --peers: onnx-fp32)"
    )
    bench.add_argument(
        "--concurrency", help="client counts (default: 1,8,32,64; with --peers: 1,64)"
    )
    bench.add_argument("--seconds", type=float, default=3.0, help="seconds per case")
    bench.add_argument(
        "--threads",
        type=int,
        help="runtime threads per inference (default: the inference cores; with --peers: 1)",
    )
    bench.add_argument(
        "--inference-cpus",
        default="auto",
        help="cores for inference, e.g. 1 or 2,3; the front ends and clients get the others "
        "(auto: the upper half of the cores; none: every thread on every core)",
    )
    bench.add_argument(
        "--client",
        choices=["raw", "tritonclient"],
        default="raw",
        help="raw: pre-encoded requests, answers checked (like perf_analyzer); "
        "tritonclient: the stock aio clients",
    )
    bench.add_argument("--workers", type=int, default=1, help="inference threads of the gateway")
    bench.add_argument("--spinning", action="store_true", help="let ONNX Runtime's threads spin")
    bench.add_argument("--max-batch", type=int, default=64, help="max_batch_size with batching on")
    bench.add_argument(
        "--delay-us", type=int, default=0, help="max_queue_delay_us with batching on"
    )
    bench.add_argument(
        "--busy-delay-us",
        type=int,
        help="the gateway's busy_delay_us with batching on (default: 0; with --peers: 20000)",
    )
    bench.add_argument("--json", type=Path, help="write the results here")
    bench.add_argument(
        "--chart", type=Path, help="draw throughput and p99 against concurrency (PNG)"
    )
    from cloud_gateway.bench_dashboard import register as register_dashboard
    from cloud_gateway.bench_fleet import register as register_fleet
    from cloud_gateway.bench_peers import add_arguments as add_peer_arguments
    from cloud_gateway.bench_remote import register as register_remote

    add_peer_arguments(bench)
    bench.set_defaults(run=_bench)
    kinds = bench.add_subparsers(dest="bench_command", metavar="KIND")

    register_remote(kinds)
    register_fleet(kinds)
    register_dashboard(kinds)


def _serve(args: argparse.Namespace) -> int:
    from cloud_gateway.server import Gateway

    try:
        name = loop_name(args.loop)
    except ValueError as exc:
        print(f"cloud-gateway serve: {exc}", file=sys.stderr)
        return 2
    gateway = Gateway(config_of(args))
    run(gateway.serve_forever(), name)
    return 0


def _bench(args: argparse.Namespace) -> int:
    if args.peers:
        from cloud_gateway.bench_peers import run_peers

        args.model = args.model or "wide-mlp"
        args.variant = args.variant or "onnx-fp32"
        args.concurrency = args.concurrency or "1,64"
        args.threads = args.threads or 1
        args.busy_delay_us = 20_000 if args.busy_delay_us is None else args.busy_delay_us
        return run_peers(args)
    from cloud_gateway.bench import run_from_args

    args.model = args.model or "digits-heavy"
    args.variant = args.variant or "onnx-int8"
    args.concurrency = args.concurrency or "1,8,32,64"
    args.busy_delay_us = args.busy_delay_us or 0
    return run_from_args(args)
