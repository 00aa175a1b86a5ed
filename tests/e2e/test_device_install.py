"""The device install guide (docs/install.md), followed as written: the wheel that
`make wheel` builds, a virtual environment of the system's Python under /opt, the
configuration under /etc, `edge-agent service install`; then the unit's own command
line starts the agent, which reports READY=1 and answers.

systemd does not run here: `systemctl` and `useradd` are recorded, not run, and the
service is started as the unit would start it. The guide's paths are moved to paths
of this test's own (the same shape: under /opt and /etc, where the sandbox sees them),
and removed at the end."""

from __future__ import annotations

import json
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from edge_core.processes import free_port, stop_process
from tests.support.paths import ROOT
from tests.support.services import need

SYSTEM_PYTHON = Path("/usr/bin/python3")

pytestmark = [
    pytest.mark.registry,
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


@dataclass
class Installed:
    """The guide's result: its environment (``prefix``), configuration folder, the unit
    written, the calls of systemctl and useradd, and the local API's port."""

    prefix: Path
    etc: Path
    units: Path
    calls: Path
    http_port: int

    def command(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """The installed ``edge-agent`` run as an operator would: from /, nothing of the
        checkout on its path."""
        return subprocess.run(
            [str(self.prefix / "bin" / "edge-agent"), *args], capture_output=True, text=True,
            timeout=timeout, cwd="/", env=CLEAN, stdin=subprocess.DEVNULL,
        )  # fmt: skip


CLEAN = {"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """The guide run as written, once: the wheel built as `make wheel` builds it."""
    need("registry")
    tmp_path = tmp_path_factory.mktemp("install")
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
        .replace(f"./{wheel.name}", str(wheel))  # the guide names the wheel built
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
        yield Installed(prefix, etc, units, calls, http_port)
    finally:
        shutil.rmtree(prefix, ignore_errors=True)
        shutil.rmtree(etc, ignore_errors=True)


def test_the_device_guide_installs_an_agent_that_starts(
    installed: Installed, tmp_path: Path
) -> None:
    assert installed.calls.read_text().splitlines() == [
        "useradd --system --no-create-home --shell /usr/sbin/nologin edge-agent",
        "systemctl daemon-reload",
        "systemctl enable --now edge-agent.service",
    ]
    prefix, etc = installed.prefix, installed.etc
    assert (prefix / "bin/python").resolve() == SYSTEM_PYTHON.resolve()  # outside /root
    unit = (installed.units / "edge-agent.service").read_text()
    assert "User=edge-agent" in unit
    exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M)
    assert exec_start is not None
    command = shlex.split(exec_start.group(1))
    assert Path(command[0]).parent == prefix / "bin"  # the environment's own interpreter
    assert command[1:] == ["-m", "edge_agent", "run", "--config", str(etc / "agent.toml")]
    with started(command, tmp_path) as messages:
        url = f"http://127.0.0.1:{installed.http_port}/v2/health/ready"
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert answer.status == 200
        assert "serving digits-light" in messages()


def redact_endpoint_faces(port: int, picture: bytes) -> int:
    """The faces the local API's redact endpoint finds in ``picture`` (a file's bytes)."""
    import tritonclient.http as thttp

    client = thttp.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=120)
    item = thttp.InferInput("image", [1], "BYTES")
    item.set_data_from_numpy(np.array([picture], dtype=object))
    try:
        return int(client.infer("redact", [item]).as_numpy("faces")[0])
    finally:
        client.close()


def test_the_installed_agent_redacts_with_its_shipped_detector_and_an_updated_one(
    installed: Installed, tmp_path: Path
) -> None:
    """Issue 30, item 1, from the installed wheel alone: `edge-agent redact` and the
    local API's redact endpoint find the astronaut's face with the shipped CenterFace;
    `models install` adds a package folder to a model_dir of the operator's own; a
    CenterFace rolled out over the air (one that finds nothing) is what both run then,
    the service after a restart too."""
    import cv2
    from skimage import data

    from tests.support.ota_world import make_world
    from tests.support.packages import blind_centerface

    picture = tmp_path / "astronaut.png"
    cv2.imwrite(str(picture), data.astronaut()[:, :, ::-1])
    redacted = installed.command("redact", str(picture), "--out", str(tmp_path / "out"))
    assert redacted.returncode == 0, redacted.stderr
    assert json.loads(redacted.stdout)[0]["faces"] == 1

    own = tmp_path / "own-models"
    added = installed.command("models", "install", str(ROOT / "models" / "digits-heavy" / "1"),
                              "--model-dir", str(own), "--profile", "generic-x86_64")  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["installed"] == "digits-heavy:1"
    listed = installed.command("models", "list", "--model-dir", str(own), "--json")
    assert [p["name"] for p in json.loads(listed.stdout)] == ["digits-heavy"]

    world = make_world(tmp_path / "world")
    try:
        device = world.enroll("cam-01")
        blind = blind_centerface(ROOT / "models" / "face-detection-centerface" / "1",
                                 tmp_path / "blind" / "2")  # fmt: skip
        world.release("face-detection-centerface", 2, blind)
        port = free_port()
        config = tmp_path / "agent.toml"
        config.write_text(
            f'device_id = "cam-01"\nmodel_dir = "{own}"\nstate_dir = "{tmp_path / "state"}"\n'
            f"[api]\nhttp_port = {port}\ngrpc_port = 0\n"
            f'[ota]\nbundle = "{device.bundle}"\nurl = "{world.url}"\ninterval_s = 3600\n'
        )
        command = [str(installed.prefix / "bin" / "python"), "-m", "edge_agent", "run",
                   "--config", str(config)]  # fmt: skip
        with started(command, tmp_path):
            assert redact_endpoint_faces(port, picture.read_bytes()) == 1  # the shipped one
        updated = installed.command("update", "--config", str(config), "--quiet")
        assert updated.returncode == 0, updated.stderr
        assert "face-detection-centerface" in updated.stdout
        redacted = installed.command("redact", str(picture), "--out", str(tmp_path / "again"),
                                     "--config", str(config))  # fmt: skip
        assert redacted.returncode == 0, redacted.stderr
        assert json.loads(redacted.stdout)[0]["faces"] == 0  # the update's detector
        with started(command, tmp_path):
            assert redact_endpoint_faces(port, picture.read_bytes()) == 0  # after a restart
    finally:
        world.stop()


@contextmanager
def started(command: list[str], tmp_path: Path) -> Iterator[Callable[[], str]]:
    """The unit's command started as systemd would (from /, NOTIFY_SOCKET set, nothing
    of the checkout on the path), until READY=1; what it told systemd so far."""
    notify_path = tmp_path / f"notify-{uuid.uuid4().hex[:6]}.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(1.0)
    env = {**CLEAN, "NOTIFY_SOCKET": str(notify_path)}
    process = subprocess.Popen(
        command, cwd="/", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    said = [""]
    try:
        end = time.monotonic() + 90
        while "READY=1" not in said[0]:
            assert process.poll() is None, process.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
            assert time.monotonic() < end, said[0]
            try:
                said[0] += notify.recv(4096).decode() + "\n"
            except TimeoutError:
                continue
        yield lambda: said[0]
    finally:
        stop_process(process)
        notify.close()
