"""The face detector delivered over the air replaces the shipped one in the privacy
checks (issue 30, item 1): before, an update of CenterFace was ignored by the exit
guard, the redact endpoint and ``edge-agent redact``, even after a restart. Here a
CenterFace that finds no face is rolled out, so that what the checks run is seen."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from skimage import data

from edge_agent.service.daemon import Daemon
from edge_core.processes import free_port
from tests.support.daemon import write_config
from tests.support.ota_world import OtaWorld, make_world
from tests.support.packages import blind_centerface
from tests.support.paths import MODELS, ROOT
from tests.support.roots import make_root

CENTERFACE = "face-detection-centerface"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[OtaWorld]:
    w = make_world(tmp_path / "world")
    yield w
    w.stop()


def faces_in_the_astronaut(daemon: Daemon) -> int:
    return daemon.agent.redact({"frame": data.astronaut()[None]}).faces


@pytest.mark.slow
def test_an_updated_detector_is_what_the_privacy_checks_run(
    world: OtaWorld, tmp_path: Path
) -> None:
    device = world.enroll("cam-01")
    config = tmp_path / "agent.toml"
    ota = (
        f'[ota]\nbundle = "{device.bundle}"\nurl = "{world.url}"\n'
        f'state_dir = "{device.state}"\ninterval_s = 3600\n'
    )
    models = tmp_path / "models"  # the operator's own: the detectors come from the package
    models.mkdir()
    write_config(config, make_root(tmp_path / "root", cpus=2), models, free_port(), 0, ota,
                 privacy=True)  # fmt: skip
    daemon = Daemon(config)
    daemon.start()
    try:
        assert faces_in_the_astronaut(daemon) == 1  # the shipped CenterFace
        blind = blind_centerface(MODELS / CENTERFACE / "1", tmp_path / "blind" / "2")
        world.release(CENTERFACE, 2, blind)
        outcomes = daemon.updater.check()
        assert any(o.name == CENTERFACE and o.status == "installed" for o in outcomes), outcomes
        assert faces_in_the_astronaut(daemon) == 0  # swapped in, no restart
        assert CENTERFACE not in daemon.agent.loaded()  # only the checks loaded it
    finally:
        daemon.stop()
    picture = tmp_path / "astronaut.png"
    import cv2

    cv2.imwrite(str(picture), data.astronaut()[:, :, ::-1])
    redacted = subprocess.run(
        [sys.executable, "-m", "edge_agent", "redact", str(picture), "--out",
         str(tmp_path / "out"), "--config", str(config)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert redacted.returncode == 0, redacted.stderr
    assert '"faces": 0' in redacted.stdout  # the command runs the update's detector too
    assert np.asarray(cv2.imread(str(tmp_path / "out" / "astronaut.png"))).shape[:2] == (512, 512)
