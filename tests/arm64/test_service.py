"""The agent as a service on the emulated aarch64 device: started as its rendered unit
says (``ExecStart`` with the wrapper interpreter, from ``/``, ``NOTIFY_SOCKET`` and
``WATCHDOG_USEC`` set), it detects a Pi 5 from its device tree, reports READY=1, answers
stock tritonclients (gRPC and HTTP) on this machine over loopback, installs an update
published by a gateway on this machine and serves it, and stops cleanly on SIGTERM."""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from edge_agent.ota import OtaStore
from edge_core.processes import free_port
from edge_core.repository import ModelRepository
from tests.support.daemon import Running, wait_logged
from tests.support.emulator import Emulator, clean_env
from tests.support.ota_world import LIGHT_INT8, OtaWorld, make_world
from tests.support.paths import MODELS
from tests.support.roots import make_root

pytestmark = pytest.mark.slow

START_S = 300.0  # emulated imports and model loads: minutes, not seconds


@pytest.fixture
def world(tmp_path: Path) -> Iterator[OtaWorld]:
    w = make_world(tmp_path / "world")
    yield w
    w.stop()


def unit_command(emulator: Emulator, config: Path, cwd: Path) -> list[str]:
    """``ExecStart`` of the unit that ``edge-agent service install`` renders on the
    device for the wrapper interpreter (``--dry-run``: its paths are where the sandbox
    would hide them, which it warns about)."""
    unit = emulator.run(
        "-m", "edge_agent", "service", "install", "--dry-run", "--config", str(config),
        "--python", str(emulator.python), cwd=cwd,
    ).stdout  # fmt: skip
    found = re.search(r"^ExecStart=(.*)$", unit, re.M)
    assert found is not None and "Type=notify" in unit and "WatchdogSec=30" in unit
    return shlex.split(found.group(1))


def start_unit(
    command: list[str], tmp: Path, config: Path, root: Path, ports: tuple[int, int]
) -> Running:
    notify_path = tmp / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    env = clean_env(NOTIFY_SOCKET=str(notify_path), WATCHDOG_USEC="30000000")
    process = subprocess.Popen(
        command, cwd="/", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    return Running(process, notify, ports[0], ports[1], config, root)


def digit() -> tuple[np.ndarray, int]:
    inputs, labels = ModelRepository(MODELS).get("digits-light").evaluation()
    return inputs[:1].astype(np.float32), int(labels[0])


def grpc_answer(port: int) -> tuple[str, int]:
    """(the model version, the class) stock tritonclient gets from the agent over gRPC."""
    pixels, _ = digit()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        request = grpcclient.InferInput("pixels", list(pixels.shape), "FP32")
        request.set_data_from_numpy(pixels)
        result = client.infer("digits-light", [request], client_timeout=60)
        version = result.get_response().model_version
        return version, int(np.argmax(result.as_numpy("probabilities")))
    finally:
        client.close()


def http_answer(port: int) -> tuple[str, int]:
    pixels, _ = digit()
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=60)
    try:
        request = httpclient.InferInput("pixels", list(pixels.shape), "FP32")
        request.set_data_from_numpy(pixels, binary_data=True)
        result = client.infer("digits-light", [request])
        version = result.get_response()["model_version"]
        return version, int(np.argmax(result.as_numpy("probabilities")))
    finally:
        client.close()


def test_the_unit_serves_tritonclient_and_an_update_from_the_gateway(
    emulator: Emulator, tmp_path: Path, world: OtaWorld
) -> None:
    device = world.enroll("cam-01")
    root = make_root(
        tmp_path / "pi5", model="Raspberry Pi 5 Model B Rev 1.0",
        compatible=["raspberrypi,5-model-b", "brcm,bcm2712"], cpus=4,
        temperatures={0: 50_000},
    )  # fmt: skip
    ports = (free_port(), free_port())
    config = tmp_path / "agent.toml"
    config.write_text(
        f'device_id = "cam-01"\nroot = "{root}"\nstate_dir = "{tmp_path / "state"}"\n'
        f"[api]\nhttp_port = {ports[0]}\ngrpc_port = {ports[1]}\n"
        f'[ota]\nbundle = "{device.bundle}"\nurl = "{world.url}"\ninterval_s = 1\njitter_s = 0\n'
    )  # the profile is not named: the agent detects it
    command = unit_command(emulator, config, tmp_path)
    assert command[0] == str(emulator.python)
    assert command[1:] == ["-m", "edge_agent", "run", "--config", str(config)]
    agent = start_unit(command, tmp_path, config, root, ports)
    try:
        agent.wait_message("READY=1", timeout=START_S)
        wait_logged(agent, ": profile raspberry-pi-5, ")  # detected from the device tree
        _, label = digit()
        assert grpc_answer(ports[1]) == ("1", label)  # the version the wheel ships
        assert http_answer(ports[0]) == ("1", label)

        world.release("digits-light", 2, LIGHT_INT8)
        end = time.monotonic() + START_S
        while (answer := grpc_answer(ports[1]))[0] != "2":
            assert time.monotonic() < end, f"still serving version 1: {agent.stderr[-20:]}"
            time.sleep(1.0)
        assert answer == ("2", label) and http_answer(ports[0]) == ("2", label)
        installed = OtaStore(tmp_path / "state" / "ota").active("digits-light")
        assert installed is not None and installed.version == 2  # in the device's A/B store
    finally:
        status = agent.stop()
    assert status == 0, agent.stderr[-20:]
    assert any(line.startswith("STOPPING=1") for _, line in agent.messages)
