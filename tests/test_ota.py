"""Over-the-air updates against a real repository served over HTTP on loopback.

Every attack of the threat model is a test here, and each ends with the device
serving its current model (:func:`assert_serves`)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from edge_agent.agent import Agent, LayeredSource
from edge_agent.assemble import OtaSource
from edge_agent.errors import DownloadError, MetadataError, NoKeyError
from edge_agent.ota import smoke_test
from edge_agent.ota.crypto import (
    decrypt_blob,
    encrypt_file,
    generate_group_key,
    unwrap_key,
    verify_blob,
    wrap_key,
)
from edge_agent.ota.fetch import download_resumable
from edge_agent.package import ModelRepository
from edge_agent.policy import load_policy
from edge_agent.profiles import ProfileStore
from edge_agent.profiles.state import DeviceState

from .conftest import MODELS, PROFILES, ROOT
from .ota_world import (
    GROUP,
    LIGHT_FP32,
    LIGHT_INT8,
    CuttingProxy,
    Device,
    OtaWorld,
    big_package,
    broken_package,
    make_world,
)

PROFILE = ProfileStore(PROFILES).get("raspberry-pi-5")


@pytest.fixture
def world(tmp_path: Path) -> Iterator[OtaWorld]:
    w = make_world(tmp_path)
    yield w
    w.stop()


def installed(world: OtaWorld, device: Device) -> int | None:
    info = world.store(device).active("digits-light")
    return info.version if info else None


def assert_serves(
    world: OtaWorld, device: Device, version: int, name: str = "digits-light"
) -> None:
    """The device's active model is ``version``, complete, and passes its smoke test."""
    store = world.store(device)
    active = store.active(name)
    assert active is not None and active.version == version
    package = store.package(name, device.enrollment.group, device.enrollment.group_key)
    assert package.version == version
    smoke_test(package, PROFILE)


def first_install(world: OtaWorld) -> Device:
    device = world.enroll("cam-01")
    world.release("digits-light", 2, LIGHT_INT8)
    outcomes = world.updater(device).check()
    assert [(o.name, o.version, o.status) for o in outcomes] == [("digits-light", 2, "installed")]
    assert_serves(world, device, 2)
    return device


# -- the formats -----------------------------------------------------------------------------


def test_blob_round_trip_and_every_tampering_is_caught(tmp_path: Path) -> None:
    source = tmp_path / "plain"
    source.write_bytes(os.urandom(10_000))
    blob = tmp_path / "blob"
    key = os.urandom(32)
    length, _ = encrypt_file(source, blob, key, name="m", version=3, chunk_size=4096)
    assert length == blob.stat().st_size == 25 + 10_000 + 3 * 16
    assert decrypt_blob(blob, key, name="m", version=3) == source.read_bytes()
    data = blob.read_bytes()
    chunk = 4096 + 16
    cases = {
        "flipped bit": data[:100] + bytes([data[100] ^ 1]) + data[101:],
        "truncated": data[: 25 + chunk],
        "extended": data + data[25 : 25 + chunk],
        "reordered": data[:25]
        + data[25 + chunk : 25 + 2 * chunk]
        + data[25 : 25 + chunk]
        + data[25 + 2 * chunk :],
    }
    from edge_agent.errors import IntegrityError

    for case, tampered in cases.items():
        blob.write_bytes(tampered)
        with pytest.raises(IntegrityError):
            decrypt_blob(blob, key, name="m", version=3)
        with blob.open("rb") as reader, pytest.raises(IntegrityError):
            verify_blob(reader, key, name="m", version=3)
        assert tampered != data, case
    blob.write_bytes(data)
    with pytest.raises(IntegrityError, match="fails its authentication tag"):
        decrypt_blob(blob, key, name="m", version=4)  # another version's blob
    with pytest.raises(IntegrityError, match="fails its authentication tag"):
        decrypt_blob(blob, os.urandom(32), name="m", version=3)


def test_key_wrapping_binds_group_model_and_version() -> None:
    private, public = generate_group_key()
    other_private, _ = generate_group_key()
    key = os.urandom(32)
    wrapped = wrap_key(key, public, name="m", version=2, group="g")
    assert unwrap_key(wrapped, private, name="m", version=2, group="g") == key
    with pytest.raises(NoKeyError, match="cannot unwrap"):
        unwrap_key(wrapped, other_private, name="m", version=2, group="g")
    with pytest.raises(NoKeyError, match="wrapped for group 'g'"):
        unwrap_key(wrapped, private, name="m", version=2, group="h")
    forged = {**wrapped, "version": "3"}
    with pytest.raises(NoKeyError):
        unwrap_key(forged, private, name="m", version=3, group="g")


# -- installing --------------------------------------------------------------------------------


def test_install_keeps_models_encrypted_at_rest(world: OtaWorld) -> None:
    device = first_install(world)
    slot = world.store(device).active("digits-light")
    assert slot is not None
    plain = LIGHT_INT8.read_bytes()
    for path in device.state.rglob("*"):
        if path.is_file():
            assert plain[:4096] not in path.read_bytes(), path  # no plaintext model on disk
    assert stat.S_IMODE(device.bundle.stat().st_mode) == 0o600
    report = world.rollouts.device_status("cam-01", "digits-light", 2)
    assert report == "installed"
    assert world.updater(device).check()[0].status == "current"


def test_hot_swap_under_concurrent_requests_fails_nothing(world: OtaWorld) -> None:
    device = world.enroll("cam-01")
    world.release("digits-light", 2, LIGHT_FP32)
    world.updater(device).check()
    store = world.store(device)
    source = LayeredSource(
        [OtaSource(store, GROUP, device.enrollment.group_key), ModelRepository(MODELS)]
    )
    agent = Agent(
        profile=PROFILE,
        repository=source,
        rules=load_policy(ROOT / "edge_agent" / "policy" / "default.toml"),
        device_state=lambda: DeviceState(),
    )
    x, _ = ModelRepository(MODELS).get("digits-light").evaluation()
    x = x.astype(np.float32)
    assert agent.infer("digits-light", {"pixels": x[:1]}).version == 2
    failures: list[BaseException] = []
    versions: list[int | None] = []
    stop = threading.Event()

    def hammer(offset: int) -> None:
        i = offset
        while not stop.is_set():
            try:
                versions.append(
                    agent.infer("digits-light", {"pixels": x[i % 300 : i % 300 + 1]}).version
                )
            except BaseException as exc:
                failures.append(exc)
            i += 1

    threads = [threading.Thread(target=hammer, args=(n * 37,)) for n in range(4)]
    for thread in threads:
        thread.start()
    world.release("digits-light", 3, LIGHT_INT8)
    updater = world.updater(device, hooks={"on_installed": agent.reload})
    time.sleep(0.2)
    outcome = updater.check()
    time.sleep(0.3)
    stop.set()
    for thread in threads:
        thread.join()
    assert outcome[0].status == "installed" and outcome[0].version == 3
    assert failures == []
    assert 2 in versions and 3 in versions and len(versions) > 100
    assert versions[-1] == 3
    assert agent.infer("digits-light", {"pixels": x[:1]}).variant == "tflite-int8"


# -- the attacks ---------------------------------------------------------------------------------


def test_tampered_blob(world: OtaWorld) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    payload = world.payload_file("digits-light", 3)
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0xFF
    payload.write_bytes(bytes(data))
    outcome = world.updater(device).check()[0]
    assert outcome.status == "failed" and "hash" in outcome.detail.lower()
    assert world.rollouts.device_status("cam-01", "digits-light", 3) == "failed"
    assert_serves(world, device, 2)


def metadata(world: OtaWorld, role: str) -> Path:
    if role == "timestamp":
        return world.repo.metadata_dir / "timestamp.json"
    version = max(int(p.name.split(".")[0]) for p in world.repo.metadata_dir.glob(f"*.{role}.json"))
    return world.repo.metadata_dir / f"{version}.{role}.json"


def test_tampered_metadata(world: OtaWorld) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    path = metadata(world, "targets")
    document = json.loads(path.read_text())
    target = document["signed"]["targets"]["models/digits-light/3/payload"]
    target["length"] += 1  # changed without a new signature
    path.write_text(json.dumps(document))
    with pytest.raises(MetadataError):
        world.updater(device).check()
    assert_serves(world, device, 2)


def test_metadata_signed_by_an_untrusted_key(world: OtaWorld) -> None:
    from securesystemslib.signer import CryptoSigner
    from tuf.api.metadata import Metadata

    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    path = metadata(world, "targets")
    signed = Metadata.from_file(str(path))
    signed.signatures.clear()
    signed.sign(CryptoSigner.generate_ed25519())  # a key the root does not name
    signed.to_file(str(path))
    with pytest.raises(MetadataError, match="verification"):
        world.updater(device).check()
    assert_serves(world, device, 2)


def test_older_metadata_replayed(world: OtaWorld) -> None:
    device = first_install(world)
    old_timestamp = (world.repo.metadata_dir / "timestamp.json").read_bytes()
    world.release("digits-light", 3, LIGHT_FP32)
    world.updater(device).check()
    assert_serves(world, device, 3)
    (world.repo.metadata_dir / "timestamp.json").write_bytes(old_timestamp)  # a replay
    with pytest.raises(MetadataError, match="version"):
        world.updater(device).check()
    assert_serves(world, device, 3)


def test_expired_metadata_freezes_nothing(world: OtaWorld) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    timestamp = world.repo.load("timestamp")
    timestamp.signed.version += 1
    timestamp.signed.expires = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(
        hours=2
    )
    world.repo._sign_and_write(timestamp, "timestamp")
    with pytest.raises(MetadataError, match="expired"):
        world.updater(device).check()
    assert_serves(world, device, 2)
    # a device without a real-time clock may be given slack
    outcome = world.updater(device, expiry_slack_s=3 * 3600).check()[0]
    assert outcome.status == "installed"
    assert_serves(world, device, 3)


def test_mix_and_match_is_refused(world: OtaWorld) -> None:
    device = first_install(world)
    older_targets = metadata(world, "targets").read_bytes()
    world.release("digits-light", 3, LIGHT_FP32)
    metadata(world, "targets").write_bytes(older_targets)  # the new snapshot, with old targets
    with pytest.raises(MetadataError):
        world.updater(device).check()
    assert_serves(world, device, 2)


def test_a_blob_longer_than_declared_is_cut_and_refused(world: OtaWorld) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    payload = world.payload_file("digits-light", 3)
    declared = payload.stat().st_size
    with payload.open("ab") as handle:
        handle.write(os.urandom(20 * 1024 * 1024))  # endless data
    proxy = CuttingProxy(("127.0.0.1", world.gateway.gateway.http_port), cut_after=1 << 60)
    try:
        outcome = world.updater(device, url=proxy.url).check()[0]
    finally:
        proxy.close()
    assert outcome.status == "failed" and "endless data" in outcome.detail
    assert proxy.body_bytes < declared + 1024 * 1024  # stopped early, did not take the 20 MB
    assert not list((device.state / "ota" / "downloads").glob("*.part"))
    assert_serves(world, device, 2)


def test_a_blob_for_another_group_has_no_key(world: OtaWorld) -> None:
    device = first_install(world)
    world.publish("digits-light", 3, LIGHT_FP32, ["jetson-fp16"])
    world.rollouts.start("digits-light", 3, GROUP, 100)  # a plan pointing at it anyway
    outcome = world.updater(device).check()[0]
    assert outcome.status == "failed" and "not published for group 'rpi5-int8'" in outcome.detail
    # and the gateway does not hand out another group's key file
    other = next(world.repo.targets_dir.glob("keys/jetson-fp16/digits-light/*.3.json"))
    path = f"/v2/ota/targets/keys/jetson-fp16/digits-light/{other.name}"
    response = world.updater(device).client.get(path)
    assert response.status_code == 404
    assert_serves(world, device, 2)


def test_a_download_cut_halfway_resumes(world: OtaWorld, tmp_path: Path) -> None:
    device = first_install(world)
    world.release("big", 1, big_package(tmp_path, 3))
    length = world.payload_file("big", 1).stat().st_size
    proxy = CuttingProxy(("127.0.0.1", world.gateway.gateway.http_port), cut_after=length // 2)
    try:
        outcome = world.updater(device, url=proxy.url).check()
    finally:
        proxy.close()
    assert [o.status for o in outcome if o.name == "big"] == ["installed"]
    blob_requests = [(line, r) for line, r in proxy.requests if "/targets/models/big/" in line]
    assert len(blob_requests) == 2
    assert blob_requests[0][1] is None
    assert blob_requests[1][1] == f"bytes={length // 2}-"  # resumed, not restarted
    assert proxy.body_bytes == length
    assert_serves(world, device, 1, name="big")
    assert_serves(world, device, 2)


def test_a_model_failing_its_smoke_test_is_rolled_back_and_reported(
    world: OtaWorld, tmp_path: Path
) -> None:
    device = first_install(world)
    world.release("digits-light", 3, broken_package(tmp_path))
    outcome = world.updater(device).check()[0]
    assert outcome.status == "failed" and "off the golden output" in outcome.detail
    assert world.rollouts.device_status("cam-01", "digits-light", 3) == "failed"
    assert_serves(world, device, 2)


def test_a_rollout_pauses_itself_on_failures(world: OtaWorld, tmp_path: Path) -> None:
    first = world.enroll("cam-01")
    second = world.enroll("cam-02")
    world.release("digits-light", 2, LIGHT_INT8)
    for device in (first, second):
        world.updater(device).check()
    world.publish("digits-light", 3, broken_package(tmp_path))
    world.rollouts.start("digits-light", 3, GROUP, 100, failure_threshold=0.5)
    assert world.updater(first).check()[0].status == "failed"
    rollout = world.rollouts.get("digits-light", 3, GROUP)
    assert rollout is not None and rollout.state == "paused"
    assert "1 of 1 reporting devices failed" in rollout.reason
    # the second device is not sent the paused version
    assert world.updater(second).check()[0].status == "current"
    assert_serves(world, first, 2)
    assert_serves(world, second, 2)


def test_staged_slices_are_stable_and_grow() -> None:
    from cloud_gateway.ota.rollouts import in_slice

    devices = [f"cam-{i:03d}" for i in range(1000)]
    ten = {d for d in devices if in_slice(d, "digits-light", 10)}
    fifty = {d for d in devices if in_slice(d, "digits-light", 50)}
    assert 60 < len(ten) < 140 and 420 < len(fifty) < 580
    assert ten <= fifty
    assert all(in_slice(d, "digits-light", 100) for d in devices)


def test_a_partial_slot_never_becomes_active(world: OtaWorld) -> None:
    device = first_install(world)
    store = world.store(device)
    slot = store.prepare("digits-light")
    (slot / "payload").write_bytes(b"half a payload")
    from edge_agent.errors import IntegrityError

    with pytest.raises(IntegrityError, match="holds no complete version"):
        store.activate("digits-light", slot.name)
    assert_serves(world, device, 2)


def test_rollback_by_hand(world: OtaWorld) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    world.updater(device).check()
    assert_serves(world, device, 3)
    previous = world.updater(device).rollback("digits-light")
    assert previous.version == 2
    assert_serves(world, device, 2)
    assert world.rollouts.device_status("cam-01", "digits-light", 2) == "rolled_back"


def test_key_rotation_is_followed(world: OtaWorld) -> None:
    device = first_install(world)
    world.repo.rotate("targets")
    world.repo.rotate("root")
    world.release("digits-light", 3, LIGHT_FP32)
    assert world.updater(device).check()[0].status == "installed"
    assert_serves(world, device, 3)
    cached_root = json.loads((device.state / "ota" / "tuf" / "root.json").read_text())
    assert cached_root["signed"]["version"] == 3


def test_bandwidth_cap_paces_the_download(tmp_path: Path, world: OtaWorld) -> None:
    first_install(world)
    world.release("big", 1, big_package(tmp_path, 2))
    path = world.payload_file("big", 1)
    device = world.devices["cam-01"]
    client = world.updater(device).client
    url = f"/v2/ota/targets/models/big/1/{path.name}"
    pauses: list[float] = []
    now = [0.0]

    def sleep(seconds: float) -> None:  # a fake clock: the test takes no time
        pauses.append(seconds)
        now[0] += seconds

    download_resumable(
        client, url, tmp_path / "blob", path.stat().st_size, bandwidth=1_000_000,
        clock=lambda: now[0], sleep=sleep,
    )  # fmt: skip
    assert (tmp_path / "blob").read_bytes() == path.read_bytes()
    assert sum(pauses) == pytest.approx(path.stat().st_size / 1_000_000, rel=0.05)
    with pytest.raises(DownloadError, match="endless data"):
        download_resumable(client, url, tmp_path / "short", 1000)


# -- power loss: kill -9 at many points of the install ---------------------------------------------

INSTALLER = Path(__file__).with_name("ota_installer.py")


def run_installer(
    device: Device, url: str, crash_at: str | None = None
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(INSTALLER), str(device.bundle), str(device.state), url]
    if crash_at is not None:
        command += ["--crash-at", crash_at]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.slow
def test_kill_9_at_twenty_points_of_the_install_leaves_a_valid_model(
    world: OtaWorld, tmp_path: Path
) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    world.release("big", 1, big_package(tmp_path, 6))
    template = tmp_path / "device-template"
    shutil.copytree(device.state, template, symlinks=True)
    # a dry run lists the steps of the install
    listing = run_installer(device, world.url, crash_at="list")
    steps = [s for s in listing.stdout.splitlines() if s]
    assert len(steps) >= 20, steps
    points = steps[:: max(1, len(steps) // 24)]
    assert len(points) >= 20
    for point in points:
        shutil.rmtree(device.state)
        shutil.copytree(template, device.state, symlinks=True)
        crashed = run_installer(device, world.url, crash_at=point)
        assert crashed.returncode == -9, (point, crashed.stderr[-500:])
        # after the power cut: a valid model, old or new, never a broken one
        active = world.store(device).active("digits-light")
        assert active is not None and active.version in (2, 3), point
        assert_serves(world, device, active.version)
        big = world.store(device).active("big")
        if big is not None:
            assert_serves(world, device, 1, name="big")
        # and the next run completes the update
        assert run_installer(device, world.url).returncode == 0, point
        assert_serves(world, device, 3)
        assert_serves(world, device, 1, name="big")
