"""``edge_core.processes``: the CPU a process tree used, read from ``/proc`` (a fake one
for the arithmetic, the real one for a child that works)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_core.processes import tree_cpu_seconds

TICK = os.sysconf("SC_CLK_TCK")


def _proc(root: Path, pid: int, name: str, ppid: int, ticks: tuple[int, int, int, int]) -> None:
    (root / str(pid)).mkdir(parents=True)
    fields = ["S", str(ppid), *["0"] * 9, *map(str, ticks), *["0"] * 30]
    (root / str(pid) / "stat").write_text(f"{pid} ({name}) {' '.join(fields)}\n")


def test_a_tree_is_its_processes_and_their_reaped_children(tmp_path: Path) -> None:
    _proc(tmp_path, 100, "server", 1, (10 * TICK, 2 * TICK, TICK, 0))
    _proc(tmp_path, 101, "worker (a) b)", 100, (3 * TICK, TICK, 0, 0))  # ")" in a name
    _proc(tmp_path, 102, "stub", 101, (4 * TICK, 0, 0, 0))
    _proc(tmp_path, 200, "other", 1, (50 * TICK, 0, 0, 0))
    (tmp_path / "self").mkdir()  # not a process directory
    (tmp_path / "103").mkdir()  # gone while read: no stat
    assert tree_cpu_seconds(100, tmp_path) == 10 + 2 + 1 + 3 + 1 + 4
    assert tree_cpu_seconds(102, tmp_path) == 4
    assert tree_cpu_seconds(999, tmp_path) is None
    assert tree_cpu_seconds(100, tmp_path / "nowhere") is None


@pytest.mark.slow
def test_a_reaped_childs_work_stays_in_its_parents_tree() -> None:
    busy = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"
    script = (
        "import subprocess, sys, time\n"
        f"subprocess.run([sys.executable, '-c', {busy!r}])\n"
        "print('done', flush=True)\ntime.sleep(30)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == "done\n"
        after = tree_cpu_seconds(parent.pid)
    finally:
        parent.kill()
        parent.wait()
    # the parent's own start is a few hundredths: the rest is the reaped child's
    assert after is not None and after >= 0.5
