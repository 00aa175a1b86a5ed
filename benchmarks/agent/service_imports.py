"""What the daemon's memory goes to: a probe that starts each configuration in a
fresh interpreter under ``-X importtime`` and lists ``sys.modules``, and another
that imports those modules again, package by package, reading RSS after each
(for :mod:`benchmarks.agent.service`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.agent.service_daemon import (
    BenchConfig,
    child_env,
    write_config,
)
from edge_core.errors import EdgeError

_PROBE = """
import json, sys, time
from pathlib import Path
from edge_agent.service.daemon import Daemon
daemon = Daemon(Path(sys.argv[1]))
daemon.start()
time.sleep(1.0)  # the MQTT and telemetry threads import on their own time
modules = list(sys.modules)
daemon.stop()
print(json.dumps(modules))
"""

# Imports the modules in the order given; each one's RSS growth goes to its package.
_ATTRIBUTE = """
import importlib, json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
start = before = rss()
added = {}
for name, group in json.load(sys.stdin):
    try:
        importlib.import_module(name)
    except (Exception, SystemExit):
        pass
    now = rss()
    added[group] = added.get(group, 0.0) + now - before
    before = now
print(json.dumps({"interpreter": start, "total": before, "added": added}))
"""


def _python(code: str, *args: str, stdin: str = "", flags: tuple[str, ...] = ()) -> Any:
    """Run ``code`` in a fresh interpreter: its last stdout line as JSON, and its stderr.

    Raises:
        EdgeError: it failed.
    """
    done = subprocess.run(
        [sys.executable, *flags, "-c", code, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
        check=False,
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise EdgeError(f"the import probe failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def _group(name: str) -> str:
    """The package a module's memory counts to (``_ssl`` to ``ssl``)."""
    top = name.split(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return f"{top.lstrip('_') or top} (stdlib)"
    return "edge_agent" if top == "cloud_gateway" else (top.lstrip("_") or top)


def measure_imports(configs: list[BenchConfig], tmp: Path) -> dict[str, Any]:
    """Which packages each configuration's daemon imports, and what each adds to RSS
    (measured on the modules of the last, largest, configuration)."""
    present: dict[str, list[str]] = {}
    order: list[str] = []
    for config in configs:
        probe = write_config(tmp, config.name + " probe", **config.spec)
        modules, trace = _python(_PROBE, str(probe.path), flags=("-X", "importtime"))
        loaded = {n for n in modules if n != "__main__" and not n.endswith(".__main__")}
        present[config.name] = sorted({_group(name) for name in loaded})
        finished = re.findall(r"^import time:\s*\d+ \|\s*\d+ \|\s*(\S+)$", trace, re.M)
        order = list(dict.fromkeys(n for n in finished if n in loaded))
        order += sorted(loaded - set(order))
    # Package by package, each after the packages it uses: the standard library first,
    # then in the order the packages finished importing, the agent's own code last.
    # (Module by module would not do: a submodule's import runs its package's __init__.)
    finished_at = {_group(name): index for index, name in enumerate(order)}
    order.sort(
        key=lambda n: (
            not _group(n).endswith("(stdlib)"),
            _group(n) == "edge_agent",
            finished_at[_group(n)],
        )
    )
    measured, _ = _python(_ATTRIBUTE, stdin=json.dumps([[n, _group(n)] for n in order]))
    added = sorted(measured["added"].items(), key=lambda item: -item[1])
    return {
        "measured_on": configs[-1].name,
        "interpreter_mb": round(measured["interpreter"], 1),
        "total_mb": round(measured["total"], 1),
        "added_mb": {group: round(mb, 2) for group, mb in added},
        "present": present,
    }
