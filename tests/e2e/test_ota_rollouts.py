"""The gateway's side of OTA: rollouts, the devices' reports, the repository, with
real devices updating from it on loopback."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cloud_gateway.ota.keys import KeyStore
from cloud_gateway.ota.publish import OtaRepository
from tests.support.ota_world import (
    GROUP,
    LIGHT_FP32,
    LIGHT_INT8,
    OtaWorld,
    assert_serves,
    first_install,
)

# -- the gateway: rollouts, reports, the repository ---------------------------------------------


def test_only_the_rollouts_own_slice_counts(state_url: str) -> None:
    from cloud_gateway.ota.rollouts import RolloutStore, in_slice
    from cloud_gateway.state import open_state

    store = RolloutStore(open_state(state_url))
    store.start("m", 2, "a", 50, failure_threshold=0.5)
    inside = [d for d in (f"d{i}" for i in range(100)) if in_slice(d, "m", 50)]
    outside = [d for d in (f"d{i}" for i in range(100)) if not in_slice(d, "m", 50)]
    for device in outside[:5]:  # devices the rollout never sent it to
        assert store.report(device, "a", "m", 2, "failed") is None
    for device in inside[:5]:  # devices of another group
        assert store.report(device, "b", "m", 2, "failed") is None
    store.report(inside[0], "a", "m", 2, "installed")
    assert store.stats("m", 2, "a") == {
        "installed": 1, "failed": 0, "rolled_back": 0, "refused": 0, "reported": 1,
    }  # fmt: skip
    rollout = store.get("m", 2, "a")
    assert rollout is not None and rollout.state == "active"
    paused = store.report(inside[1], "a", "m", 2, "failed")
    assert paused is not None and paused.state == "paused"
    assert "1 of 2 reporting devices failed" in paused.reason
    # a refusal is counted, pauses nothing, and keeps nothing from the device
    store.start("n", 1, "a", 100, failure_threshold=0.5)
    assert store.report("d1", "a", "n", 1, "refused", "the signed metadata was refused") is None
    assert store.get("n", 1, "a").state == "active"  # type: ignore[union-attr]
    assert store.stats("n", 1, "a")["refused"] == 1
    assert store.plan("d1", "a").get("n") == 1
    store.report("d1", "a", "n", 1, "failed")
    assert "n" not in store.plan("d1", "a")
    # and never overwrites a version the device reported installed
    store.report("d2", "a", "n", 1, "installed")
    store.report("d2", "a", "n", 1, "refused", "the signed metadata was refused")
    assert store.device_status("d2", "n", 1) == "installed"
    store.close()


def test_an_aborted_rollout_is_never_moved_by_a_concurrent_change(
    state_url: str,
) -> None:
    from cloud_gateway.ota.rollouts import RolloutStore
    from cloud_gateway.state import open_state

    other = RolloutStore(open_state(state_url))
    armed = [False]

    def clock() -> float:  # another process aborts it while this one pauses it
        if armed[0]:
            armed[0] = False
            other.set_state("m", 2, "a", "aborted", "by another operator")
        return time.time()

    store = RolloutStore(open_state(state_url), clock=clock)
    store.start("m", 2, "a", 100)
    armed[0] = True
    with pytest.raises(KeyError, match="not aborted"):
        store.set_state("m", 2, "a", "paused")
    rollout = store.get("m", 2, "a")
    assert rollout is not None and rollout.state == "aborted"
    with pytest.raises(KeyError):
        store.set_state("m", None, None, "active")
    store.close()
    other.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "body",
    [
        b'{"name": "digits-light", "version": 100000000000000000000000000, "status": "failed"}',
        b'{"name": "digits-light", "version": 9223372036854775808, "status": "failed"}',
        b'{"name": "digits-light", "version": 2, "status": "failed", "detail": "\\ud800"}',
        b'{"name": "digits-light", "version": 2, "status": "failed", "detail": 5}',
        b'{"name": "\\u0000", "version": 2, "status": "failed"}',
        b'{"name": "a/../b", "version": 2, "status": "failed"}',
        b"[" * 10_000,
    ],
)
def test_a_malformed_report_is_a_400(world: OtaWorld, body: bytes) -> None:
    device = world.enroll("cam-01")
    client = world.updater(device).client
    response = client.post(
        "/v2/ota/report", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400, response.text


@pytest.mark.slow
def test_concurrent_publishes_sign_one_after_the_other(world: OtaWorld) -> None:
    barrier = threading.Barrier(2, timeout=2)

    class MeetingKeys(KeyStore):
        """Keys whose targets signer waits for the other publisher (to widen the race)."""

        def signer(self, role: str) -> Any:
            if role == "targets":
                with contextlib.suppress(threading.BrokenBarrierError):
                    barrier.wait()
            return super().signer(role)

    world.groups.ensure(GROUP)
    errors: list[BaseException] = []

    def publish(version: int) -> None:
        repo = OtaRepository(world.repo.root, MeetingKeys(world.keys.root))
        try:
            repo.publish(
                name="digits-light", version=version, model_file=LIGHT_INT8,
                groups={GROUP: world.groups.public(GROUP)},
            )  # fmt: skip
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=publish, args=(v,)) for v in (2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    targets = world.repo.targets()
    assert "models/digits-light/2/payload" in targets
    assert "models/digits-light/3/payload" in targets


def test_devices_added_at_once_get_the_same_group_key(tmp_path: Path) -> None:
    from cloud_gateway.ota.groups import GroupKeys

    barrier = threading.Barrier(12)
    keys: list[bytes] = []

    def add() -> None:
        barrier.wait()
        keys.append(GroupKeys(tmp_path).ensure("new-group")[0])

    threads = [threading.Thread(target=add) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(keys) == 12 and len(set(keys)) == 1
    assert GroupKeys(tmp_path).ensure("new-group")[0] == keys[0]
    assert [p.name for p in (tmp_path / "groups").iterdir()] == ["new-group.json"]


class PowerCut(Exception):
    pass


class CuttingKeys(KeyStore):
    """Keys that lose power at one point of a rotation: ``key-written`` (right after
    the new key reaches the disk) or ``root-written`` (before the new key replaces the old)."""

    def __init__(self, root: Path, at: str) -> None:
        super().__init__(root)
        self.at = at

    def new_key(self, role: str) -> Any:
        signer = super().new_key(role)
        if self.at == "key-written":
            raise PowerCut
        return signer

    def stage(self, role: str) -> Any:
        signer = super().stage(role)
        if self.at == "key-written":
            raise PowerCut
        return signer

    def commit(self, role: str) -> None:
        if self.at == "root-written":
            raise PowerCut
        super().commit(role)


@pytest.mark.slow
@pytest.mark.parametrize("role", ["targets", "root"])
@pytest.mark.parametrize("at", ["key-written", "root-written"])
def test_a_rotation_cut_by_a_power_loss_never_loses_the_signing_key(
    world: OtaWorld, role: str, at: str
) -> None:
    device = first_install(world)
    cut = OtaRepository(world.repo.root, CuttingKeys(world.keys.root, at))
    with pytest.raises(PowerCut):
        cut.rotate(role)
    # the next publish (with the keys as the crash left them) signs what devices accept
    world.release("digits-light", 3, LIGHT_FP32)
    assert world.updater(device).check()[0].status == "installed"
    assert_serves(world, device, 3)
    assert not list(world.keys.root.glob("*.new"))
    world.repo.rotate(role)  # and rotating again works
    world.release("digits-light", 4, LIGHT_INT8)
    assert world.updater(device).check()[0].status == "installed"
    assert_serves(world, device, 4)


def test_the_expiry_slack_reaches_into_the_tuf_versions_allowed() -> None:
    """`allow_expiry_slack` is the one place that sets python-tuf's private reference
    time (there is no public way): pinned to the versions pyproject.toml allows."""
    from importlib.metadata import version

    from tuf.ngclient._internal.trusted_metadata_set import TrustedMetadataSet

    major = int(version("tuf").split(".")[0])
    assert 5 <= major < 8, "a tuf outside the allowed range: check allow_expiry_slack"
    assert "reference_time" in TrustedMetadataSet.__init__.__code__.co_names
