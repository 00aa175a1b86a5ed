"""The command runner both command lines share (``edge-agent``, ``cloud-gateway``).

Every command prints its result on stdout and exits 0; errors exit non-zero
with one line on stderr, and a traceback only with ``--debug`` -- an
unexpected exception too (a bug: it says so, and how to see the traceback).
A reader that goes away early (``edge-agent profile show NAME | head -1``)
ends the command quietly.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from edge_core.errors import EdgeError
from edge_core.memory import give_back_large_buffers

__all__ = ["moved_benchmark", "run_command"]


def run_command(
    args: argparse.Namespace,
    *,
    prog: str,
    expected: tuple[type[BaseException], ...] = (EdgeError,),
) -> int:
    """Run the parsed command (``args.run``); turn what it raises into an exit status.

    ``expected`` errors (the package's own) print one line; anything else is a
    bug and prints one line that says so (the traceback with ``--debug``); a
    closed stdout pipe ends the command quietly. Large buffers are given back to the
    system when freed (:func:`~edge_core.memory.give_back_large_buffers`).
    """
    give_back_large_buffers()
    try:
        code = int(args.run(args))
        # Flush here, not at exit, so that a closed pipe is caught below.
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader went away (`edge-agent ... | head -1`): not an error of ours.
        # Point stdout at devnull so that the interpreter's final flush does not
        # fail again and print a traceback on the way out.
        _silence_stdout()
        return 1  # as Python's own recipe does: the output was cut short
    except expected as exc:
        if args.debug:
            traceback.print_exc()
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the last resort: a bug, told in one line
        if args.debug:
            traceback.print_exc()
        print(
            f"{prog}: error: {getattr(args, 'command', prog)} failed unexpectedly: "
            f"{type(exc).__name__}: {exc} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # stdout is not a real file (tests capture it): nothing to flush later
    finally:
        os.close(devnull)


def moved_benchmark(
    argv: Sequence[str], prog: str, names: frozenset[str], flags: dict[str, str]
) -> str | None:
    """Where a benchmark that ``prog bench`` ran before 0.3.0 went, told before its old
    options reach the parser (which would refuse them first): ``prog bench NAME ...``
    for a name in ``names``, or ``prog bench ... FLAG ...`` for a flag in ``flags``
    (flag -> the benchmark's name), is ``python -m benchmarks NAME ...`` in a checkout.
    ``None`` for anything else."""
    if "bench" not in argv:
        return None
    rest = list(argv[list(argv).index("bench") + 1 :])
    name = rest[0] if rest and rest[0] in names else None
    if name is not None:
        rest = rest[1:]
    else:
        name = next((flags[flag] for flag in rest if flag in flags), None)
    if name is None:
        return None
    command = " ".join(["python -m benchmarks", name, *rest])
    return (
        f"`{prog} bench` no longer runs the project's benchmark {name!r}: it is "
        f"`{command}` in a checkout of the project (python -m benchmarks --help)"
    )
