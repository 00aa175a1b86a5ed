"""The ``edge-agent`` command line.

Every command prints its result on stdout (JSON where a program will read
it, a table where a person will) and exits 0; errors exit non-zero with one
line on stderr, and a traceback only with ``--debug`` -- an unexpected
exception too (a bug: it says so, and how to see the traceback). A reader that
goes away early (``edge-agent profile show NAME | head -1``) ends the command
quietly. On 32-bit ARM, where the agent cannot run, every command says so and
what does instead (:mod:`edge_agent.cli.arm32`) before anything imports NumPy: the
commands are imported only once that is clear.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from edge_agent.cli.arm32 import arm32_refusal_here
from edge_core import __version__

__all__ = ["main"]

PROG = "edge-agent"
# what `edge-agent bench NAME` ran before 0.3.0, now `python -m benchmarks NAME`
MOVED_BENCHMARKS = frozenset({"hybrid", "offload", "ota", "mqtt", "service", "privacy", "stream"})


class _OneLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{PROG}: {record.levelname.lower()}: {record.getMessage()}"


def build_parser() -> argparse.ArgumentParser:
    from edge_agent.cli import (
        infer_cmd,
        install_cmd,
        latency_cmd,
        models_cmd,
        policy_cmd,
        profile_cmd,
        redact_cmd,
        run_cmd,
        service_cmd,
        stream_cmd,
        toolchain_cmd,
        update_cmd,
    )

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Edge inference agent: run models on this device, offload to the cloud.",
    )
    parser.add_argument("--debug", action="store_true", help="verbose logs and tracebacks")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    profile_cmd.register(commands)
    models = models_cmd.register(commands)
    toolchain_cmd.register(models)
    update_cmd.register(commands, models)
    install_cmd.register(models)
    infer_cmd.register(commands)
    policy_cmd.register(commands)
    redact_cmd.register(commands)
    latency_cmd.register(commands)
    run_cmd.register(commands)
    service_cmd.register(commands)
    stream_cmd.register(commands)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    refusal: Callable[[], str | None] = arm32_refusal_here,
) -> int:
    """Run the command ``argv`` names; its exit status. ``refusal`` says why this
    interpreter cannot run the agent (``None``: it can)."""
    reason = refusal()
    if reason is not None:
        print(f"{PROG}: error: {reason}", file=sys.stderr)
        return 1
    from edge_core.cli import moved_benchmark, run_command

    argv = list(sys.argv[1:] if argv is None else argv)
    moved = moved_benchmark(argv, PROG, MOVED_BENCHMARKS, {})
    if moved is not None:
        print(f"{PROG}: error: {moved}", file=sys.stderr)
        return 2
    if "bench" in argv:
        at = argv.index("bench") + 1
        if argv[at : at + 1] == ["runtime"]:
            del argv[at]  # 0.2.0's default suite: what `bench --model` runs now
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLineFormatter())
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING, handlers=[handler], force=True
    )
    return run_command(args, prog=PROG)
