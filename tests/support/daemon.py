"""`edge-agent run` as systemd runs it, for the tests: a child process with a test
NOTIFY_SOCKET and WATCHDOG_USEC, its notifications and JSON log lines read by
threads, on a fake device root with digits-light only."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_core.processes import free_port, stop_process

from .paths import MODELS, ROOT
from .roots import make_root

__all__ = [
    "Running",
    "light_repository",
    "read_answers",
    "start_agent",
    "wait_logged",
    "write_config",
]


@dataclass
class Running:
    process: subprocess.Popen[bytes]
    notify: socket.socket
    http_port: int
    grpc_port: int
    config: Path
    root: Path
    messages: list[tuple[float, str]] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read_notify, daemon=True).start()
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_reader.start()

    def _read_notify(self) -> None:
        while True:
            try:
                data = self.notify.recv(4096)
            except OSError:
                return
            for line in data.decode().splitlines():
                self.messages.append((time.monotonic(), line))

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr.append(line.decode(errors="replace").rstrip())

    def wait_message(self, prefix: str, timeout: float = 30.0, after: int = 0) -> float:
        end = time.monotonic() + timeout
        exited_at = None
        while time.monotonic() < end:
            for at, line in self.messages[after:]:
                if line.startswith(prefix):
                    return at
            if exited_at is None and self.process.poll() is not None:
                exited_at = time.monotonic()  # its last messages may still be on the socket
            if exited_at is not None and time.monotonic() - exited_at > 1.0:
                raise AssertionError(f"the agent exited: {self.stderr[-20:]}")
            time.sleep(0.02)
        raise AssertionError(
            f"no {prefix} within {timeout} s: {self.messages}, {self.stderr[-20:]}"
        )

    def logs(self) -> list[dict[str, Any]]:
        if self.process.poll() is not None:  # exited: read its last lines first
            self._stderr_reader.join(10)
        out = []
        for line in self.stderr:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def get(self, path: str) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=10)
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()

    def post_json(
        self, path: str, document: Any, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=30)
        connection.request("POST", path, json.dumps(document), headers or {})
        response = connection.getresponse()
        return response.status, json.loads(response.read())

    def stop(self) -> int:
        status = stop_process(self.process, 30)
        self.notify.close()
        return status


def light_repository(tmp: Path, names: tuple[str, ...] = ("digits-light",)) -> Path:
    models = tmp / "models"
    for name in names:
        shutil.copytree(MODELS / name, models / name)
    return models


def write_config(
    path: Path,
    root: Path,
    models: Path,
    http_port: int,
    grpc_port: int,
    extra: str = "",
    api: str = "",
    privacy: bool = False,
) -> None:
    path.write_text(
        f"""device_id = "cam-01"
profile = "raspberry-pi-5"
root = "{root}"
model_dir = "{models}"
state_dir = "{path.parent / "state"}"
[privacy]
face_detector = {str(privacy).lower()}
[api]
http_port = {http_port}
grpc_port = {grpc_port}
drain_s = 5
{api}
[thermal]
interval_s = 0.1
hysteresis_c = 5
{extra}"""
    )


def start_agent(
    tmp: Path,
    extra: str = "",
    watchdog_usec: int = 400_000,
    api: str = "",
    cpus: int = 2,
    models: tuple[str, ...] = ("digits-light",),
    privacy: bool = False,
    address_space: int | None = None,
) -> Running:
    """``cpus``: CPUs with cpufreq in the fake root (0: a board whose power modes cannot
    be applied); ``models``: the sample models it has; ``privacy``: whether it searches
    pictures for faces (the models must include the detector's); ``address_space``: the
    process's limit on virtual memory in bytes (``prlimit --as``): a request that would
    take more fails in the agent rather than take the machine."""
    root = make_root(tmp / "root", cpus=cpus, temperatures={0: 50_000})
    http_port, grpc_port = free_port(), free_port()
    config = tmp / "agent.toml"
    models_dir = light_repository(tmp, models)
    write_config(config, root, models_dir, http_port, grpc_port, extra, api, privacy)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify_path = tmp / "notify.sock"
    notify.bind(str(notify_path))
    env = {
        **os.environ,
        "NOTIFY_SOCKET": str(notify_path),
        "WATCHDOG_USEC": str(watchdog_usec),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("WATCHDOG_PID", None)
    limit = [] if address_space is None else ["prlimit", f"--as={address_space}", "--"]
    process = subprocess.Popen(
        [*limit, sys.executable, "-m", "edge_agent", "run", "--config", str(config)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    return Running(process, notify, http_port, grpc_port, config, root)


def read_answers(sock: socket.socket, count: int) -> str:
    """What the server sent once ``count`` status lines are in, and 0.3 s more (to see
    a surplus one)."""
    data = b""
    end = time.monotonic() + 10
    while data.count(b"HTTP/1.1 ") < count and time.monotonic() < end:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    sock.settimeout(0.3)
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pass
    return data.decode()


def wait_logged(agent: Running, text: str, count: int = 1, timeout: float = 10.0) -> list[str]:
    """The log lines holding ``text`` once there are ``count``: stderr is read from a pipe
    by a thread, so a line may arrive after the notification that followed it."""
    end = time.monotonic() + timeout
    while True:
        found = [e["message"] for e in agent.logs() if text in e["message"]]
        if len(found) >= count:
            return found
        assert time.monotonic() < end, f"no {text!r} ×{count} in the log: {agent.stderr[-10:]}"
        time.sleep(0.05)


def metric_value(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None
