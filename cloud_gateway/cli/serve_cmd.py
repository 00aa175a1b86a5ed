"""``cloud-gateway serve``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cloud_gateway.cli.common import config_of
from edge_core.loops import LOOPS, loop_name, run

__all__ = ["register"]


def register(commands: Any) -> None:
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
