"""``python -m benchmarks``: every benchmark the Makefile and the benchmarks page name is
one of its commands, and takes the options they give it."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from benchmarks.__main__ import build_parser
from tests.support.paths import ROOT


def makefile_commands() -> dict[str, list[str]]:
    """``make bench-NAME``'s arguments after ``-m benchmarks``, by NAME."""
    commands = {}
    for line in (ROOT / "Makefile").read_text().splitlines():
        found = re.match(r"BENCH_(\S+)\s*=\s*-m benchmarks (.*)$", line)
        if found:
            commands[found[1]] = shlex.split(found[2])
    return commands


def documented_commands() -> list[list[str]]:
    """Every ``python -m benchmarks ...`` in backticks on the benchmarks page that is a
    command as typed (not a synopsis with ``NAME``, ``N`` or ``[--option]``)."""
    text = (ROOT / "docs" / "benchmarks" / "index.md").read_text()
    commands = [shlex.split(c) for c in re.findall(r"`python -m benchmarks ([^`]+)`", text)]
    typed = [c for c in commands if not re.search(r"\[|\||\b[A-Z]+\b|^--help$", " ".join(c))]
    assert len(typed) > 10  # the page's table, and the sections
    return typed


def test_the_makefile_runs_the_moved_benchmarks_through_the_entry_point() -> None:
    assert {"hybrid", "offload", "ota", "mqtt", "service", "stream", "gateway",
            "gateway-wide", "remote", "peers", "fleet-1k", "fleet-10k", "faces"} <= set(
        makefile_commands()
    )  # fmt: skip


@pytest.mark.parametrize(
    "argv", [*makefile_commands().values(), *documented_commands()], ids=" ".join
)
def test_each_named_benchmark_is_a_command_that_takes_its_options(argv: list[str]) -> None:
    args = build_parser().parse_args([*argv, "--json", "out.json"])
    assert callable(args.run)


@pytest.mark.slow
def test_help_lists_every_benchmark() -> None:
    answer = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert answer.returncode == 0, answer.stderr
    for name in ("hybrid", "offload", "ota", "mqtt", "service", "privacy", "stream", "gateway",
                 "remote", "peers", "fleet", "dashboard", "figures"):  # fmt: skip
        assert re.search(rf"^\s+{name}\b", answer.stdout, re.MULTILINE), name
