"""Child processes and ports: the CPU time a server's processes have used (the load
generator's, :mod:`cloud_gateway.loadgen`), and, for what starts servers of its own
(the benchmarks, the demo, the tests), a free port on loopback and a stop as a
service manager does it."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["free_port", "stop_process", "tree_cpu_seconds"]


def stop_process(process: subprocess.Popen[Any], timeout: float = 10.0) -> int:
    """Stop a child process as a service manager would: SIGTERM, then SIGKILL after
    ``timeout`` seconds; its exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return int(process.returncode)


def free_port() -> int:
    """A TCP port free on loopback now (for a server started next)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stat(proc: Path, pid: str) -> tuple[int, float] | None:
    """A process's parent and the CPU seconds it and its reaped children have used, from
    ``/proc/PID/stat``; ``None`` when it is gone or unreadable."""
    try:
        text = (proc / pid / "stat").read_text()
    except OSError:
        return None
    # the name in parentheses may hold spaces and parentheses: the fields follow the last
    fields = text[text.rfind(")") + 2 :].split()
    try:
        ppid = int(fields[1])
        ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    except (IndexError, ValueError):
        return None
    return ppid, ticks / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int, proc: Path = Path("/proc")) -> float | None:
    """The CPU seconds (user and system) used so far by process ``pid`` and every process
    below it (a server's workers, Triton's backend stubs): those running, and those
    already reaped by their parents. ``None`` where ``proc`` cannot tell (no such
    process, not Linux). A difference of two readings is what the tree used between
    them, but for a process that both started and exited unreaped in between."""
    try:
        entries = [e.name for e in proc.iterdir() if e.name.isdigit()]
    except OSError:
        return None
    stats = {e: _stat(proc, e) for e in entries}
    root = stats.get(str(pid))
    if root is None:
        return None
    children: dict[int, list[str]] = {}
    for entry, stat in stats.items():
        if stat is not None:
            children.setdefault(stat[0], []).append(entry)
    total, todo, seen = 0.0, [str(pid)], set()
    while todo:
        entry = todo.pop()
        stat = stats.get(entry)
        if stat is None or entry in seen:
            continue
        seen.add(entry)
        total += stat[1]
        todo.extend(children.get(int(entry), ()))
    return total
