"""What the demo's parts share: paths, names, its error, the servers it starts."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edge_core.processes import stop_process

Array = np.ndarray[Any, Any]
Describe = Callable[[dict[str, Array]], str]

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"


class DemoError(Exception):
    """A step of the demo failed; the message says which and why."""


def mosquitto_installed() -> bool:
    """As :mod:`benchmarks.agent.mosquitto` looks for the broker."""
    candidate = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    return os.access(candidate, os.X_OK)


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "    (no log)"
    return "\n".join("    " + line for line in text[-lines:])


class Processes:
    """The demo's servers; each is stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self) -> None:
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, command: list[str], log: Path, **kwargs: Any) -> None:
        with log.open("ab") as out:
            self.running[name] = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, **kwargs
            )

    def alive(self, name: str) -> bool:
        return self.running[name].poll() is None

    def stop(self, name: str, timeout: float = 20.0) -> int | None:
        process = self.running.pop(name, None)
        if process is None:
            return None
        return stop_process(process, timeout)

    def stop_all(self) -> None:
        for name in reversed(list(self.running)):
            self.stop(name)


class TelemetryWatcher:
    """The operator's view of the broker: the devices' telemetry, counted by kind."""

    def __init__(self, port: int, password: str) -> None:
        from edge_core.mqtt import new_client

        self.kinds: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.client = new_client("demo-operator", "_gateway", password, None)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        client.subscribe("devices/+/telemetry/#", qos=1)

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        with self._lock:
            self.kinds[str(message.topic).rsplit("/", 1)[-1]] += 1

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
