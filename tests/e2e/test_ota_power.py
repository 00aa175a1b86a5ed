"""Power cuts during an OTA install: kill -9 at many points of the A/B switch, and the
slots (power cuts, smoke tests, locks); the device always boots a whole model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge_core.errors import (
    ModelNotFoundError,
)
from tests.support.ota_world import (
    GROUP,
    INSTALLER,
    LIGHT_FP32,
    LIGHT_INT8,
    GatewayTransport,
    OtaWorld,
    assert_serves,
    big_package,
    broken_package,
    first_install,
    run_installer,
)
from tests.support.paths import ROOT

# -- power loss: kill -9 at many points of the install ---------------------------------------------


def crash_points(steps: list[str], spread: int) -> list[int]:
    """Every step of the A/B switch that empties a slot, and ``spread`` more over the rest.

    The switch runs from emptying the trash to the new link (``switched``) of the
    one model whose inactive slot holds a version (the only one that moves a slot
    to the trash); the other points are spread evenly over all the other steps,
    from the plan to the last report.
    """
    trash = steps.index("prepare:moved-to-trash")
    first = max(i for i in range(trash) if steps[i] == "prepare:trash-emptied")
    switch = range(first, steps.index("switched", trash) + 1)
    others = [i for i in range(len(steps)) if i not in switch]
    every = len(others) / spread
    return sorted({*switch, *(others[int(k * every)] for k in range(spread)), others[-1]})


@pytest.mark.slow
def test_kill_9_at_twenty_points_of_the_install_leaves_a_valid_model(
    world: OtaWorld, tmp_path: Path
) -> None:
    # the device holds two versions (v2 active, v1 in the other slot): installing v3
    # empties that slot, then switches; "big" is a first install, with no slot to empty
    device = world.enroll("cam-01")
    for version, file in ((1, LIGHT_INT8), (2, LIGHT_FP32)):
        world.release("digits-light", version, file)
        assert world.updater(device).check()[0].status == "installed"
    kept = world.store(device).previous("digits-light")
    assert kept is not None and kept.version == 1
    world.release("digits-light", 3, LIGHT_INT8)
    world.release("big", 1, big_package(tmp_path, 3))
    template = tmp_path / "device-template"
    shutil.copytree(device.state, template, symlinks=True)
    # a dry run lists the steps of the install, in order; a crash point is an index in it
    steps = run_installer(device, world.url, "--list-steps").stdout.split()
    points = crash_points(steps, spread=10)
    assert len(points) >= 20
    chosen = [steps[i] for i in points]
    for step in ("prepare:moved-to-trash", "prepare:trash-synced", "prepare:old-removed",
                 "slot:meta-renamed", "activate:link-made", "activate:renamed"):  # fmt: skip
        assert step in chosen, step
    assert points[0] <= 1 and points[-1] == len(steps) - 1, (points, len(steps))
    for point in points:
        where = f"killed at step {point} ({steps[point]})"
        shutil.rmtree(device.state)
        shutil.copytree(template, device.state, symlinks=True)
        crashed = run_installer(device, world.url, "--crash-at", str(point))
        assert crashed.returncode == -9, (where, crashed.stderr[-500:])
        # after the power cut: a valid model, old or new, never a broken one
        store = world.store(device)
        active = store.active("digits-light")
        assert active is not None and active.version in (2, 3), where
        assert_serves(world, device, active.version)
        # the other slot: empty, or a complete version (v1, v2, or a v3 written but not
        # switched to yet, which the next run switches to without a download)
        previous = store.previous("digits-light")
        if previous is not None:
            assert previous.version in {1, 2, 3} - {active.version}, where
            store.package("digits-light", GROUP, device.enrollment.group_key, previous)
        if store.active("big") is not None:
            assert_serves(world, device, 1, name="big")
        # and the next run completes the update
        assert run_installer(device, world.url).returncode == 0, where
        assert_serves(world, device, 3)
        assert_serves(world, device, 1, name="big")
        kept = store.previous("digits-light")
        assert kept is not None and kept.version == 2, where


# -- the slots: power cuts, smoke tests, locks ---------------------------------------------------


@pytest.mark.slow
def test_a_slot_cut_while_being_emptied_is_no_previous_version(world: OtaWorld) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    world.updater(device).check()
    store = world.store(device)
    previous = store.previous("digits-light")
    assert previous is not None and previous.version == 2
    # what a power cut in the middle of removing the slot's files leaves
    (previous.path / "key.json").unlink()
    assert store.previous("digits-light") is None
    with pytest.raises(ModelNotFoundError):
        world.updater(device).rollback("digits-light")
    with (previous.path / "key.json").open("w") as handle:
        handle.write("{}")
    with (previous.path / "payload").open("r+b") as handle:
        handle.truncate(100)
    assert store.previous("digits-light") is None
    assert_serves(world, device, 3)
    # the next install empties the slot by a rename first, and clears what a cut left there
    (store.trash / "digits-light.a.leftover").mkdir()
    world.release("digits-light", 4, LIGHT_INT8)
    assert world.updater(device).check()[0].status == "installed"
    assert list(store.trash.iterdir()) == []
    assert_serves(world, device, 4)


@pytest.mark.slow
def test_a_failed_smoke_test_keeps_the_previous_version(world: OtaWorld, tmp_path: Path) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    world.updater(device).check()
    world.release("digits-light", 4, broken_package(tmp_path))
    steps: list[str] = []
    outcome = world.updater(device, hooks={"on_step": steps.append}).check()[0]
    assert outcome.status == "failed" and "off the golden output" in outcome.detail
    assert "slot-prepared" not in steps  # tested before the slot was touched
    store = world.store(device)
    previous = store.previous("digits-light")
    assert previous is not None and previous.version == 2
    assert not list(store.downloads.glob("*.part"))
    assert_serves(world, device, 3)
    assert world.updater(device).rollback("digits-light").version == 2
    assert_serves(world, device, 2)


@pytest.mark.slow
def test_a_failed_version_is_not_downloaded_again(world: OtaWorld, tmp_path: Path) -> None:
    device = first_install(world)
    world.publish("digits-light", 3, broken_package(tmp_path))
    world.rollouts.start("digits-light", 3, GROUP, 100, failure_threshold=1.0)
    assert world.updater(device).check()[0].status == "failed"
    transport = GatewayTransport()
    outcomes = world.updater(device, transport=transport).check()
    assert [(o.version, o.status) for o in outcomes] == [(2, "current")]
    assert transport.blob_requests() == []
    # starting the rollout again offers it again, once
    world.rollouts.start("digits-light", 3, GROUP, 100, failure_threshold=1.0)
    assert world.updater(device).check()[0].status == "failed"
    assert_serves(world, device, 2)


@pytest.mark.slow
def test_stale_partial_downloads_are_removed(world: OtaWorld, tmp_path: Path) -> None:
    device = first_install(world)
    store = world.store(device)
    stale = store.downloads / f"{'0' * 64}.part"
    stale.write_bytes(os.urandom(1000))
    world.release("big", 1, big_package(tmp_path, 3))
    sha = world.payload_file("big", 1).name.split(".")[0]
    kept = store.downloads / f"{sha}.part"
    kept.write_bytes(world.payload_file("big", 1).read_bytes()[:4096])  # resumable
    steps: list[str] = []
    outcomes = world.updater(device, hooks={"on_step": steps.append}).check()
    assert [o.status for o in outcomes if o.name == "big"] == ["installed"]
    assert not stale.exists()
    assert_serves(world, device, 1, name="big")


@pytest.mark.slow
def test_two_updaters_never_run_at_once(world: OtaWorld, tmp_path: Path) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    gate = tmp_path / "go"
    command = [sys.executable, str(INSTALLER), str(device.bundle), str(device.state), world.url]
    first = subprocess.Popen(
        [*command, "--pause-at", "slot-prepared", "--gate", str(gate)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        reached = gate.with_name("go.reached")
        deadline = time.monotonic() + 60
        while not reached.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert reached.exists(), "the first updater never reached its pause"
        second = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
        )
        with pytest.raises(subprocess.TimeoutExpired):
            second.wait(timeout=4)  # it waits for the lock the first one holds
        gate.touch()
        first_out, first_err = first.communicate(timeout=120)
        second_out, second_err = second.communicate(timeout=120)
    finally:
        gate.touch()
        first.kill()
    assert first.returncode == 0, first_err[-500:]
    assert second.returncode == 0, second_err[-500:]
    assert [o["status"] for o in json.loads(first_out)] == ["installed"]
    assert [o["status"] for o in json.loads(second_out)] == ["current"]
    assert_serves(world, device, 3)
    previous = world.store(device).previous("digits-light")
    assert previous is not None and previous.version == 2
