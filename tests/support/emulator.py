"""The emulated aarch64 device of ``make test-arm64``: the wrapper interpreter and the
facts that tools/arm64.py wrote in ``emulator.json``.

Every command runs as systemd would run the agent: from a folder of the test's own
(never the checkout, which would shadow the installed package), with an environment of
a few variables (none of the host's Python's), and bounded by a timeout."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["EMULATED_NOTE", "Emulator", "clean_env"]

#: said wherever an emulated duration is shown
EMULATED_NOTE = "under QEMU user-mode emulation on an x86 host: not a performance figure"


def clean_env(**extra: str) -> dict[str, str]:
    """A unit's environment: PATH and ``Environment=PYTHONUNBUFFERED=1``, plus ``extra``."""
    return {"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1", "LC_ALL": "C.UTF-8", **extra}


@dataclass(frozen=True)
class Emulator:
    python: Path
    facts: dict[str, Any]

    @classmethod
    def load(cls, path: Path) -> Emulator:
        facts = json.loads(path.read_text())
        return cls(Path(facts["python"]), facts)

    def run(
        self, *args: str, cwd: Path, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``python ARGS`` on the emulated device (it must succeed unless ``check`` is false)."""
        done = subprocess.run(
            [str(self.python), *args], cwd=cwd, env=clean_env(), capture_output=True,
            text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if check:
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        return done

    def agent(self, *args: str, cwd: Path, timeout: float = 600) -> Any:
        """What ``edge-agent ARGS`` prints on the emulated device, as JSON."""
        return json.loads(self.run("-m", "edge_agent", *args, cwd=cwd, timeout=timeout).stdout)
