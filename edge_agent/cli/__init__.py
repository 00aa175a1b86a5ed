"""The ``edge-agent`` command line.

Every command prints its result on stdout (JSON where a program will read
it, a table where a person will) and exits 0; errors exit non-zero with one
line on stderr, and a traceback only with ``--debug``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Sequence

from edge_agent.cli import (
    bench_cmd,
    infer_cmd,
    models_cmd,
    policy_cmd,
    profile_cmd,
    run_cmd,
    service_cmd,
    update_cmd,
)
from edge_agent.errors import EdgeError

__all__ = ["main"]

PROG = "edge-agent"


class _OneLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{PROG}: {record.levelname.lower()}: {record.getMessage()}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Edge inference agent: run models on this device, offload to the cloud.",
    )
    parser.add_argument("--debug", action="store_true", help="verbose logs and tracebacks")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    profile_cmd.register(commands)
    update_cmd.register(commands, models_cmd.register(commands))
    infer_cmd.register(commands)
    policy_cmd.register(commands)
    bench_cmd.register(commands)
    run_cmd.register(commands)
    service_cmd.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLineFormatter())
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING, handlers=[handler], force=True
    )
    try:
        return int(args.run(args))
    except EdgeError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
