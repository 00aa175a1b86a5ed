"""Commands that write the service's state run as the service's account: with a real
gateway, and the agent in processes of its own, as root and as an unprivileged account
(``nobody``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .support.ota_world import LIGHT_INT8, OtaWorld, make_world
from .support.paths import ROOT

NOBODY = 65534  # the unprivileged account the service's account stands for here


def _python_for(uid: int) -> tuple[list[str], dict[str, str]] | None:
    """A Python that ``uid`` may run with this checkout and its libraries: this one, or
    the system's of the same version (this one may live where only root looks, such as
    a pyenv under /root), with the virtual environment's libraries on its path."""
    site = sysconfig.get_paths()["purelib"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{site}", "PYTHONNOUSERSITE": "1"}
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for python in (sys.executable, f"/usr/bin/python{version}"):
        try:
            probe = subprocess.run(
                [python, "-c", "import edge_agent, tuf, httpx"], user=uid, group=uid,
                extra_groups=[], env=env, cwd="/", capture_output=True, timeout=60,
            )  # fmt: skip
        except OSError:
            continue
        if probe.returncode == 0:
            return [python], env
    return None


@pytest.fixture(scope="module")
def python() -> tuple[list[str], dict[str, str]]:
    if os.geteuid() != 0:
        pytest.skip("changing accounts needs root")
    found = _python_for(NOBODY)
    if found is None:
        pytest.skip(f"no Python that uid {NOBODY} may run with this checkout")
    return found


@pytest.fixture
def world(tmp_path: Path) -> Iterator[OtaWorld]:
    w = make_world(tmp_path)
    yield w
    w.stop()


@pytest.fixture
def home() -> Iterator[Path]:
    """A folder the unprivileged account can reach (pytest's tmp_path is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="edge-account-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def device_files(world: OtaWorld, home: Path, **ota: Any) -> tuple[Path, Path]:
    """The agent configuration and the state directory of a device enrolled in the
    world, as installed: the bundle and the state the service account's."""
    device = world.enroll("cam-01")
    bundle = home / "cam-01.json"
    shutil.copy(device.bundle, bundle)
    os.chown(bundle, NOBODY, NOBODY)
    bundle.chmod(0o600)
    state = home / "state"
    state.mkdir()
    os.chown(state, NOBODY, NOBODY)
    settings = "".join(f"{key} = {json.dumps(value)}\n" for key, value in ota.items())
    config = home / "agent.toml"
    config.write_text(
        f'profile = "raspberry-pi-5"\nstate_dir = "{state}"\n'
        f'[ota]\nbundle = "{bundle}"\nurl = "{world.url}"\n{settings}'
    )
    config.chmod(0o644)
    return config, state


def agent(
    python: tuple[list[str], dict[str, str]], *args: str, uid: int | None = None
) -> subprocess.CompletedProcess[str]:
    command, env = python
    return subprocess.run(
        [*command, "-m", "edge_agent", *args], env=env, cwd="/", capture_output=True,
        text=True, timeout=120, user=uid, group=uid, extra_groups=[] if uid else None,
    )  # fmt: skip


def owners(folder: Path) -> dict[str, int]:
    return {
        str(path.relative_to(folder)): path.lstat().st_uid for path in sorted(folder.rglob("*"))
    }


def test_update_run_as_root_leaves_the_state_to_the_service_account(
    world: OtaWorld, home: Path, python: tuple[list[str], dict[str, str]]
) -> None:
    world.release("digits-light", 2, LIGHT_INT8)
    config, state = device_files(world, home)
    # what `cloud-gateway rollout start` tells the operator to run, with sudo
    updated = agent(python, "update", "--config", str(config), "--quiet")
    assert updated.returncode == 0, updated.stderr
    outcomes = json.loads(updated.stdout)["outcomes"]
    assert [(o["version"], o["status"]) for o in outcomes] == [(2, "installed")]
    assert f"update runs as nobody (uid {NOBODY}), who owns {state}" in updated.stderr
    files = owners(state)
    assert "ota/tuf/root.json" in files and "ota/lock" in files
    assert {path: uid for path, uid in files.items() if uid != NOBODY} == {}
    # and the service's own checks, as its account, go on
    again = agent(python, "update", "--config", str(config), "--quiet", uid=NOBODY)
    assert again.returncode == 0, again.stderr
    assert [o["status"] for o in json.loads(again.stdout)["outcomes"]] == ["current"]
    assert "runs as" not in again.stderr  # not root: nothing to change


def test_a_state_holding_files_of_another_account_is_refused_as_root(
    world: OtaWorld, home: Path, python: tuple[list[str], dict[str, str]]
) -> None:
    config, state = device_files(world, home)
    metadata = state / "ota" / "tuf"
    metadata.mkdir(parents=True)
    for folder in (state / "ota", metadata):
        os.chown(folder, NOBODY, NOBODY)
    (metadata / "root.json").write_text("{}")  # root's, as an older version left it
    refused = agent(python, "update", "--config", str(config), "--quiet")
    assert refused.returncode == 1
    assert f"{metadata / 'root.json'} is not owned by nobody, who owns {state}" in refused.stderr
    assert f"chown -R nobody: {state}" in refused.stderr
    assert owners(state) == {"ota": NOBODY, "ota/tuf": NOBODY, "ota/tuf/root.json": 0}
