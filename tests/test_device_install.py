"""The device install guide (docs/install.md), followed as written: the wheel that
`make wheel` builds, a virtual environment of the system's Python under /opt, the
configuration under /etc, `edge-agent service install`; then the unit's own command
line starts the agent, which reports READY=1 and answers.

systemd does not run here: `systemctl` and `useradd` are recorded, not run, and the
service is started as the unit would start it. The guide's paths are moved to paths
of this test's own (the same shape: under /opt and /etc, where the sandbox sees them),
and removed at the end."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from edge_core.processes import free_port, stop_process

from .support.paths import ROOT

SYSTEM_PYTHON = Path("/usr/bin/python3")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0 or not SYSTEM_PYTHON.exists(),
        reason="the guide installs as root with the system's Python",
    ),
]


def guide_block() -> str:
    page = (ROOT / "docs" / "install.md").read_text()
    start = page.index("<!-- device-install")
    block = page[page.index("```sh\n", start) + 6 :]
    return block[: block.index("```")]


def test_the_device_guide_installs_an_agent_that_starts(tmp_path: Path) -> None:
    wheel_dir = tmp_path / "dist"
    subprocess.run(  # what `make wheel` runs
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
         str(wheel_dir), str(ROOT)],
        check=True,
    )  # fmt: skip
    (wheel,) = wheel_dir.glob("edge_inference-*.whl")
    tag = uuid.uuid4().hex[:8]
    prefix, etc = Path(f"/opt/edge-agent-test-{tag}"), Path(f"/etc/edge-agent-test-{tag}")
    units, calls = tmp_path / "units", tmp_path / "calls"
    units.mkdir()
    http_port, grpc_port = free_port(), free_port()
    script = (
        guide_block()
        .replace("/opt/edge-agent", str(prefix))
        .replace("/etc/edge-agent", str(etc))
        .replace("./edge_inference-0.1.0-py3-none-any.whl", str(wheel))
        .replace("service install ", f"service install --unit-dir {units} ")
        .replace("http_port = 8080", f"http_port = {http_port}")
        .replace("grpc_port = 8081", f"grpc_port = {grpc_port}")
    )
    assert script.count(str(prefix)) >= 3 and str(etc) in script  # the guide's paths moved
    stubs = (
        'sudo() { "$@"; }\n'  # as root already
        f'systemctl() {{ echo "systemctl $*" >> {calls}; }}\n'
        f'useradd() {{ echo "useradd $*" >> {calls}; }}\n'
        f'python3() {{ {SYSTEM_PYTHON} "$@"; }}\n'
    )
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", stubs + script],
            capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        assert calls.read_text().splitlines() == [
            "useradd --system --no-create-home --shell /usr/sbin/nologin edge-agent",
            "systemctl daemon-reload",
            "systemctl enable --now edge-agent.service",
        ]
        assert (prefix / "bin/python").resolve() == SYSTEM_PYTHON.resolve()  # outside /root
        unit = (units / "edge-agent.service").read_text()
        assert "User=edge-agent" in unit
        exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M)
        assert exec_start is not None
        command = shlex.split(exec_start.group(1))
        assert Path(command[0]).parent == prefix / "bin"  # the environment's own interpreter
        assert command[1:] == ["-m", "edge_agent", "run", "--config", str(etc / "agent.toml")]
        assert_it_starts(command, tmp_path, http_port)
    finally:
        shutil.rmtree(prefix, ignore_errors=True)
        shutil.rmtree(etc, ignore_errors=True)


def assert_it_starts(command: list[str], tmp_path: Path, http_port: int) -> None:
    """Start the unit's command as systemd would (from /, NOTIFY_SOCKET set, nothing of
    the checkout on the path): READY=1, then the local API answers."""
    notify_path = tmp_path / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(1.0)
    env = {"PATH": "/usr/bin:/bin", "NOTIFY_SOCKET": str(notify_path), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        command, cwd="/", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        end, messages = time.monotonic() + 60, ""
        while "READY=1" not in messages:
            assert process.poll() is None, process.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
            assert time.monotonic() < end, messages
            try:
                messages += notify.recv(4096).decode() + "\n"
            except TimeoutError:
                continue
        url = f"http://127.0.0.1:{http_port}/v2/health/ready"
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert answer.status == 200
        assert "serving digits-light" in messages
    finally:
        stop_process(process)
        notify.close()
