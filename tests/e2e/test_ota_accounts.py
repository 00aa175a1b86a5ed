"""Commands that write the service's state run as the service's account, and a service
whose update checks keep failing says so to the gateway: with a real gateway, and the
agent in processes of its own, as root and as an unprivileged account (``nobody``)."""

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

from cloud_gateway.ota.checks import CheckStore
from edge_agent.ota.failures import REPORT_EVERY_S, CheckFailures
from tests.support.ota_world import GROUP, LIGHT_INT8, OtaWorld
from tests.support.paths import ROOT
from tests.support.waiting import wait_for

NOBODY = 65534  # the unprivileged account the service's account stands for here

# the updater's background loop, as the service runs it (edge_agent.service.daemon)
SERVICE = """
import sys
from pathlib import Path
from edge_agent.assemble import create_updater, resolve_profile
from edge_agent.config import load_agent_config
config = load_agent_config(Path(sys.argv[1]))
create_updater(config, resolve_profile(config)).run()
"""


def test_the_gateway_hears_of_failing_checks_once_per_interval_and_of_their_end() -> None:
    failures = CheckFailures(report_every_s=600.0)
    assert failures.succeeded() is None  # nothing failed: nothing to say
    first = failures.failed("the metadata", now=0.0)
    assert first == {"failing": True, "failures": 1, "detail": "the metadata"}
    assert failures.failed("the metadata", now=1.0) is not None  # the first was not taken
    failures.told({"failing": True}, now=1.0)
    assert [failures.failed("again", now=t) for t in (2.0, 300.0, 600.0)] == [None] * 3
    assert failures.failed("again", now=601.0) == {
        "failing": True, "failures": 6, "detail": "again"
    }  # fmt: skip
    failures.told({"failing": True}, now=601.0)
    assert failures.succeeded() == {"failing": False}
    assert failures.succeeded() == {"failing": False}  # until the gateway takes it
    failures.told({"failing": False}, now=602.0)
    assert failures.succeeded() is None
    assert failures.failed("new", now=603.0) == {"failing": True, "failures": 1, "detail": "new"}
    assert REPORT_EVERY_S >= 60  # a device checking every second costs one status a minute


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_service_whose_update_checks_keep_failing_tells_the_gateway(
    world: OtaWorld, home: Path, python: tuple[list[str], dict[str, str]]
) -> None:
    world.release("digits-light", 2, LIGHT_INT8)
    config, state = device_files(world, home, interval_s=1, jitter_s=0)
    # the state an `edge-agent update` run as root left before: root's trusted root, 0600
    metadata = state / "ota" / "tuf"
    metadata.mkdir(parents=True)
    for folder in (state / "ota", metadata):
        os.chown(folder, NOBODY, NOBODY)
    root_json = metadata / "root.json"
    root_json.write_bytes(world.repo.root_bytes())
    root_json.chmod(0o600)
    checks = CheckStore(world.gateway.gateway.database)
    command, env = python
    log = home / "service.log"
    with log.open("w") as output:
        service = subprocess.Popen(
            [*command, "-c", SERVICE, str(config)], env=env, cwd="/", stdout=output,
            stderr=subprocess.STDOUT, user=NOBODY, group=NOBODY, extra_groups=[],
        )  # fmt: skip
    try:
        failing = wait_for(lambda: checks.failing_devices(GROUP), 60, "a failing check", log=log)
        (check,) = failing
        assert check["device"] == "cam-01"
        assert check["detail"].startswith("PermissionError: [Errno 13] Permission denied")
        assert f"{root_json}" in check["detail"] and f"chown -R nobody: {state}" in check["detail"]
        shown = world.cli("rollout", "status", "--devices")
        assert "device cam-01: update checks failing: PermissionError: [Errno 13]" in shown
        assert "no device has reported yet" not in shown
        # checks every second, told once: the next status is due only after REPORT_EVERY_S
        wait_for(lambda: log.read_text().count("update check failed unexpectedly") >= 3,
                 60, "three failed checks", log=log)  # fmt: skip
        (check,) = checks.failing_devices(GROUP)
        assert check["failures"] == 1 and check["at"] == check["since"]
        # the operator gives the state back: the next check installs, and says so
        os.chown(root_json, NOBODY, NOBODY)
        wait_for(lambda: not checks.failing_devices(GROUP), 60, "the end of the failures", log=log)
        wait_for(lambda: world.rollouts.device_status("cam-01", "digits-light", 2) == "installed",
                 60, "the install's report", log=log)  # fmt: skip
        assert "update checks failing" not in world.cli("rollout", "status", "--devices")
    finally:
        service.terminate()
        service.wait(timeout=30)
