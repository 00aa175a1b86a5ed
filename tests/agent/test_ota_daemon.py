"""A rollback (or update) done by hand beside a running daemon reaches the daemon: it
swaps in the store's active version without a restart or SIGHUP."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_agent.service.daemon import Daemon
from edge_core.processes import free_port
from tests.support.daemon import write_config
from tests.support.ota_world import LIGHT_FP32, LIGHT_INT8, OtaWorld, make_world
from tests.support.paths import MODELS
from tests.support.roots import make_root
from tests.support.waiting import wait_for


@pytest.fixture
def world(tmp_path: Path) -> Iterator[OtaWorld]:
    w = make_world(tmp_path / "world")
    yield w
    w.stop()


def serving(daemon: Daemon) -> int:
    return int(daemon.agent.loaded()["digits-light"]["version"])


@pytest.mark.slow
def test_a_rollback_by_hand_reaches_the_running_daemon(world: OtaWorld, tmp_path: Path) -> None:
    device = world.enroll("cam-01")
    world.release("digits-light", 2, LIGHT_INT8)
    world.updater(device).check()
    world.release("digits-light", 3, LIGHT_FP32)
    world.updater(device).check()
    assert world.store(device).active("digits-light").version == 3  # type: ignore[union-attr]

    config = tmp_path / "agent.toml"
    ota = (
        f'[ota]\nbundle = "{device.bundle}"\nurl = "{world.url}"\n'
        f'state_dir = "{device.state}"\ninterval_s = 3600\n'
    )
    write_config(config, make_root(tmp_path / "root", cpus=2), MODELS, free_port(), 0, ota)
    daemon = Daemon(config)
    daemon.start()
    try:
        daemon.agent.infer("digits-light", {"pixels": [[0.0] * 64]})
        assert serving(daemon) == 3
        command = ["models", "rollback", "digits-light", "--config", str(config)]
        rolled = subprocess.run(
            [sys.executable, "-m", "edge_agent", *command],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert rolled.returncode == 0 and "back to version 2" in rolled.stdout, rolled.stderr
        wait_for(lambda: serving(daemon) == 2, what="the daemon to serve version 2, not 3")
        answer = daemon.agent.infer("digits-light", {"pixels": [[0.0] * 64]})
        assert answer.version == 2 and answer.variant == "tflite-int8"
    finally:
        daemon.stop()


@pytest.mark.slow
def test_a_rollback_after_the_first_update_serves_the_bundled_model_again(
    world: OtaWorld, tmp_path: Path
) -> None:
    device = world.enroll("cam-01")
    world.release("digits-light", 2, LIGHT_INT8)
    world.updater(device).check()  # v2 over the bundled v1, no other slot
    config = tmp_path / "agent.toml"
    ota = (
        f'[ota]\nbundle = "{device.bundle}"\nurl = "{world.url}"\n'
        f'state_dir = "{device.state}"\ninterval_s = 3600\n'
    )
    write_config(config, make_root(tmp_path / "root", cpus=2), MODELS, free_port(), 0, ota)
    daemon = Daemon(config)
    daemon.start()
    try:
        daemon.agent.infer("digits-light", {"pixels": [[0.0] * 64]})
        assert serving(daemon) == 2
        rolled = subprocess.run(
            [sys.executable, "-m", "edge_agent", "models", "rollback", "digits-light",
             "--config", str(config)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert rolled.returncode == 0, rolled.stderr
        assert "back to version 1 (the bundled model)" in rolled.stdout
        wait_for(lambda: serving(daemon) == 1, what="the daemon to serve version 1, not 2")
    finally:
        daemon.stop()
