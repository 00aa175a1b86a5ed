"""``python -m benchmarks NAME [options]``: run one of the project's benchmarks.

Each prints its table and, with ``--json FILE``, writes its report; ``make bench``
runs them all and renders the figures page (``python -m benchmarks figures``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from edge_core.cli import run_command
from edge_core.errors import EdgeError

__all__ = ["main"]

PROG = "python -m benchmarks"


def build_parser() -> argparse.ArgumentParser:
    from benchmarks import page
    from benchmarks.agent import commands as agent
    from benchmarks.gateway import dashboard, fleet, limits, remote
    from benchmarks.peers import compare

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="The project's benchmarks: each prints a table and writes JSON.",
    )
    parser.add_argument("--debug", action="store_true", help="verbose logs and tracebacks")
    names = parser.add_subparsers(dest="command", metavar="NAME", required=True)
    agent.register(names)
    limits.register(names)
    remote.register(names)
    compare.register(names)
    fleet.register(names)
    dashboard.register(names)
    page.register(names)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="benchmarks: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    return run_command(args, prog=PROG, expected=(EdgeError, OSError))


if __name__ == "__main__":
    raise SystemExit(main())
