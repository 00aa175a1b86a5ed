"""Over-the-air updates against a real repository served over HTTP on loopback.

Every attack of the threat model is a test here, and each ends with the device
serving its current model (:func:`assert_serves`)."""

from __future__ import annotations

import contextlib
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
from typing import Any

import httpx
import numpy as np
import pytest

from cloud_gateway.ota.keys import KeyStore
from cloud_gateway.ota.publish import OtaRepository, due_roles
from cloud_gateway.server import GatewayThread
from edge_agent.agent import Agent, LayeredSource
from edge_agent.assemble import OtaSource
from edge_agent.ota.fetch import download_resumable, fetch_plan
from edge_agent.ota.signed import refresh
from edge_agent.ota.updater import not_for_profile
from edge_agent.policy import load_policy
from edge_agent.profiles.state import DeviceState
from edge_core.errors import (
    ConfigError,
    DownloadError,
    MetadataError,
    ModelNotFoundError,
    NoKeyError,
    UpdateError,
)
from edge_core.ota.crypto import (
    decrypt_blob,
    encrypt_file,
    generate_group_key,
    unwrap_key,
    verify_blob,
    wrap_key,
)
from edge_core.repository import ModelRepository
from tests.support.ota_world import (
    GROUP,
    INSTALLER,
    LIGHT_FP32,
    LIGHT_INT8,
    PROFILE,
    CuttingProxy,
    Device,
    EncodingServer,
    GatewayTransport,
    OtaWorld,
    assert_serves,
    big_package,
    broken_package,
    compress,
    first_install,
    make_world,
    plan_answer,
    run_installer,
)
from tests.support.paths import MODELS, ROOT


@pytest.fixture
def world(tmp_path: Path) -> Iterator[OtaWorld]:
    w = make_world(tmp_path)
    yield w
    w.stop()


def installed(world: OtaWorld, device: Device) -> int | None:
    info = world.store(device).active("digits-light")
    return info.version if info else None


# -- the formats -----------------------------------------------------------------------------


def test_a_package_blob_tampered_past_the_archives_end_is_refused(tmp_path: Path) -> None:
    """The package reader stops at the tar's end marker; the chunks after it (the end
    blocks, the record's padding) are still decrypted and their tags checked."""
    from cloud_gateway.ota.archive import package_archive
    from edge_agent.ota.store import open_package
    from edge_core.errors import IntegrityError

    archive, _ = package_archive(LIGHT_INT8, "digits-light", 4, tmp_path)
    blob, key = tmp_path / "payload", os.urandom(32)
    encrypt_file(archive, blob, key, name="digits-light", version=4, chunk_size=1024)
    assert open_package(blob, key, name="digits-light", version=4).version == 4
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1  # the last chunk's tag: all tar padding by now
    blob.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="fails its authentication tag"):
        open_package(blob, key, name="digits-light", version=4)
    blob.write_bytes(bytes(data[:-1]) + bytes([data[-1] ^ 1]) + b"\0" * 16)  # extended
    with pytest.raises(IntegrityError, match="past its last chunk"):
        open_package(blob, key, name="digits-light", version=4)


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
    from edge_core.errors import IntegrityError

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
    # bytes changed on the way are refused, not failed: that blocks nothing on the device
    assert outcome.status == "refused" and "hash" in outcome.detail.lower()
    assert world.rollouts.device_status("cam-01", "digits-light", 3) == "refused"
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
    # the gateway hears of it: a failure of the rollout
    status, detail = world.rollouts.device_report(device.id, "digits-light", 3) or ("", "")
    assert status == "refused" and "the signed metadata was refused" in detail
    assert world.rollouts.stats("digits-light", 3, GROUP)["refused"] == 1
    assert world.rollouts.device_status(device.id, "digits-light", 2) == "installed"


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
    # the device refused the metadata: counted, but it does not pause the rollout (what
    # one device's path refuses says nothing of the model)
    rollout = world.rollouts.get("digits-light", 3, GROUP)
    assert rollout is not None and rollout.state == "active"
    assert world.rollouts.stats("digits-light", 3, GROUP)["refused"] == 1
    # a device without a real-time clock may be given slack
    outcome = world.updater(device, expiry_slack_s=3 * 3600).check()[0]
    assert outcome.status == "installed"
    assert_serves(world, device, 3)


def test_refresh_keeps_a_fleet_updating_past_the_snapshot_expiry(world: OtaWorld) -> None:
    device = first_install(world)
    now = datetime.now(timezone.utc).replace(microsecond=0)
    # v3 was published 31 days ago, and nothing since: its snapshot (30 days) has expired
    month_ago = OtaRepository(world.repo.root, world.keys, clock=lambda: now - timedelta(days=31))
    month_ago.publish(
        name="digits-light", version=3, model_file=LIGHT_FP32,
        groups={GROUP: world.groups.ensure(GROUP)[1]},
    )  # fmt: skip
    world.rollouts.start("digits-light", 3, GROUP, 100.0)
    targets_version = world.repo.load("targets").signed.version
    # a fresh timestamp alone (what a refresh used to sign) leaves the snapshot expired
    world.repo.refresh_timestamp()
    with pytest.raises(MetadataError, match=r"snapshot\.json is expired"):
        world.updater(device).check()
    assert_serves(world, device, 2)
    # signed as of `now` (the real clock may tick past a second boundary meanwhile)
    result = OtaRepository(world.repo.root, world.keys, clock=lambda: now).refresh()
    assert result.signed == ["snapshot", "timestamp"] and not result.root_due
    assert result.expires["snapshot"] == now + timedelta(days=30)
    assert world.repo.load("targets").signed.version == targets_version  # 59 days left: kept
    # the device's refusal paused the rollout; fixed, the operator resumes it
    world.rollouts.set_state("digits-light", 3, GROUP, "active")
    outcome = world.updater(device).check()[0]
    assert (outcome.version, outcome.status) == (3, "installed")
    assert_serves(world, device, 3)
    # 50 days on, the targets (90 days) are past half their life: signed again too
    later = OtaRepository(world.repo.root, world.keys, clock=lambda: now + timedelta(days=50))
    assert later.refresh().signed == ["targets", "snapshot", "timestamp"]
    assert world.repo.load("targets").signed.version == targets_version + 1


def test_which_roles_a_refresh_signs() -> None:
    now = datetime(2030, 1, 1, tzinfo=timezone.utc)

    def left(**days: float) -> dict[str, datetime]:
        spans = {"root": 300.0, "targets": 80.0, "snapshot": 25.0, "timestamp": 6.0, **days}
        return {role: now + timedelta(days=span) for role, span in spans.items()}

    assert due_roles(left(), now) == ["timestamp"]
    assert due_roles(left(timestamp=-3), now) == ["timestamp"]
    assert due_roles(left(snapshot=15.1), now) == ["timestamp"]
    assert due_roles(left(snapshot=14.9), now) == ["snapshot", "timestamp"]
    assert due_roles(left(snapshot=-1), now) == ["snapshot", "timestamp"]
    assert due_roles(left(targets=44.9), now) == ["targets", "snapshot", "timestamp"]
    assert due_roles(left(targets=-1, snapshot=29), now) == ["targets", "snapshot", "timestamp"]
    assert due_roles(left(root=1), now) == ["timestamp"]  # never the root: renewed by hand
    assert due_roles(left(snapshot=20, targets=85), now, margin=0.9) == ["snapshot", "timestamp"]


def test_refresh_says_when_the_root_nears_expiry(tmp_path: Path) -> None:
    keys = KeyStore(tmp_path / "keys")
    keys.init()
    now = datetime.now(timezone.utc).replace(microsecond=0)
    OtaRepository(tmp_path / "ota", keys, clock=lambda: now - timedelta(days=320)).init()
    result = OtaRepository(tmp_path / "ota", keys).refresh()
    assert result.root_due and result.expires["root"] == now + timedelta(days=45)
    assert result.signed == ["targets", "snapshot", "timestamp"]  # all three had expired


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
    assert outcome.status == "refused" and "endless data" in outcome.detail
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
    # why, as the device reported it: in the reason, and in each device's report
    failure = world.rollouts.reports("digits-light", 3, GROUP)[0]
    assert failure["device"] == "cam-01" and failure["status"] == "failed"
    assert failure["detail"] and f"cam-01: {failure['detail'][:60]}" in rollout.reason
    # the second device is not sent the paused version, also by a restarted gateway
    config = world.gateway.gateway.config
    world.gateway.stop()
    world.gateway = GatewayThread(config)  # the same state directory: the same SQLite file
    assert world.updater(second).check()[0].status == "current"
    assert world.updater(first).check()[0].status == "current"  # its failure is remembered
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
    from edge_core.errors import IntegrityError

    with pytest.raises(IntegrityError, match="holds no complete version"):
        store.activate("digits-light", slot.name)
    assert_serves(world, device, 2)


def test_a_rollback_after_the_first_update_goes_back_to_the_bundled_model(
    world: OtaWorld,
) -> None:
    """`models rollback` right after the first update once said there was nothing to go
    back to, while the bundled version had been serving: it is the previous version."""
    device = first_install(world)  # v2 over the bundled v1
    installed: list[tuple[str, object]] = []
    updater = world.updater(
        device,
        hooks={"bundled": lambda name: 1, "on_installed": lambda n, p: installed.append((n, p))},
    )
    back = updater.rollback("digits-light")
    assert (back.version, back.source) == (1, "the bundled model")
    store = world.store(device)
    assert store.active("digits-light") is None  # the bundled model serves again
    assert installed == [("digits-light", None)]  # the agent reloads from its source
    assert world.rollouts.device_status("cam-01", "digits-light", 2) == "rolled_back"
    outcomes = world.updater(device, hooks={"bundled": lambda name: 1}).check()
    assert "installed" not in [o.status for o in outcomes]  # v2 is not offered again
    # a model that is neither bundled nor has a previous slot: nothing to go back to
    with pytest.raises(ModelNotFoundError, match="no previous version"):
        world.updater(device, hooks={"bundled": lambda name: None}).rollback("digits-light")


def test_rollback_by_hand_sticks(world: OtaWorld) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    world.updater(device).check()
    assert_serves(world, device, 3)
    previous = world.updater(device).rollback("digits-light")
    assert previous.version == 2
    assert_serves(world, device, 2)
    # the gateway hears which version the device left, and does not offer it again
    assert world.rollouts.device_status("cam-01", "digits-light", 3) == "rolled_back"
    transport = GatewayTransport()
    outcomes = world.updater(device, transport=transport).check()
    assert [(o.version, o.status) for o in outcomes] == [(2, "current")]
    assert transport.blob_requests() == []
    assert_serves(world, device, 2)
    # until the operator starts its rollout again: then the kept slot is used, not a download
    world.rollouts.start("digits-light", 3, GROUP, 100)
    transport = GatewayTransport()
    outcomes = world.updater(device, transport=transport).check()
    assert [(o.version, o.status) for o in outcomes] == [(3, "installed")]
    assert transport.blob_requests() == []
    assert_serves(world, device, 3)


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


# -- compression bombs: only unencoded bodies, limits on the bytes on the wire ---------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
def test_a_compressed_blob_is_refused_before_it_is_read(tmp_path: Path, encoding: str) -> None:
    if encoding == "br":
        pytest.importorskip("brotli")
    bomb = compress(b"\0" * (64 << 20), encoding)  # 64 MiB once decoded
    assert len(bomb) < 100_000
    server = EncodingServer(lambda path: bomb if path == "/blob" else None, encoding)
    try:
        with httpx.Client(base_url=server.url) as client:
            # the signed length is the wire length: a decoding client would take it all in
            with pytest.raises(DownloadError, match=f"{encoding}-encoded.*refused"):
                download_resumable(client, "/blob", tmp_path / "blob", len(bomb))
            (tmp_path / "half").write_bytes(b"\0" * 100)  # a resumed download too
            with pytest.raises(DownloadError, match=f"{encoding}-encoded"):
                download_resumable(client, "/blob", tmp_path / "half", len(bomb))
    finally:
        server.close()
    assert not (tmp_path / "blob").exists()
    assert (tmp_path / "half").stat().st_size == 100
    assert server.accepted == ["identity", "identity"]


def test_the_installer_does_not_ask_again_for_a_refused_answer(tmp_path: Path) -> None:
    """A compressed or endless answer is refused at once, not retried with back-off."""
    from types import SimpleNamespace

    from edge_agent.ota.install import Installer
    from edge_agent.ota.store import OtaStore
    from edge_core.errors import DownloadRefused

    bomb = compress(b"\0" * (1 << 20), "gzip")
    for encoding, body, length in (("gzip", bomb, len(bomb)), (None, b"x" * 5000, 100)):
        server = EncodingServer(lambda path, body=body: body, encoding)
        info = SimpleNamespace(path="models/m/1/payload", length=length, hashes={"sha256": "00"})
        try:
            with httpx.Client(base_url=server.url) as client:
                installer = Installer(OtaStore(tmp_path / "ota"), client, None, PROFILE)  # type: ignore[arg-type]
                started = time.monotonic()
                with pytest.raises(DownloadRefused):
                    installer._download(info, tmp_path / f"part-{encoding}", "m")
        finally:
            server.close()
        assert len(server.accepted) == 1, encoding  # asked once
        assert time.monotonic() - started < 2.0  # no retries with their backoff
    assert not (tmp_path / "part-None").exists()  # an endless answer's bytes are dropped


def test_a_blob_longer_than_signed_is_cut_in_the_stream(tmp_path: Path) -> None:
    """No Content-Length to refuse up front (a body that ends when the connection
    closes): the download stops at the signed length and keeps nothing past it."""
    endless = bytes(range(256)) * 40_000  # ~10 MB against 1,000 signed bytes
    server = EncodingServer(lambda path: endless, None, declare_length=False)
    try:
        with (
            httpx.Client(base_url=server.url) as client,
            pytest.raises(DownloadError, match="more than"),
        ):
            download_resumable(client, "/blob", tmp_path / "blob", 1000)
    finally:
        server.close()
    assert not (tmp_path / "blob").exists() or (tmp_path / "blob").stat().st_size <= 1000


def test_compressed_metadata_and_plan_are_refused(world: OtaWorld, tmp_path: Path) -> None:
    def answer(path: str) -> bytes | None:
        if path == "/v2/ota/plan":
            return compress(b'{"models": [{"name": "digits-light", "version": 2}]}', "gzip")
        name = path.removeprefix("/v2/ota/metadata/")
        file = world.repo.metadata_dir / name
        return compress(file.read_bytes(), "gzip") if "/" not in name and file.is_file() else None

    server = EncodingServer(answer)
    try:
        with httpx.Client(base_url=server.url) as client:
            with pytest.raises(DownloadError, match="gzip-encoded"):
                fetch_plan(client)
            # the metadata, through python-tuf's fetcher: valid, signed, but compressed
            with pytest.raises(DownloadError, match="gzip-encoded"):
                refresh(
                    url=server.url, client=client, metadata_dir=tmp_path / "tuf",
                    downloads=tmp_path, trusted_root=world.repo.root_bytes(), timeout_s=10,
                )  # fmt: skip
    finally:
        server.close()
    assert server.accepted and set(server.accepted) == {"identity"}


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


# -- profiles: a model published for some device profiles only ----------------------------------


def test_a_model_for_other_profiles_is_skipped_not_installed(world: OtaWorld) -> None:
    device = first_install(world)  # a raspberry-pi-5
    group_key = {GROUP: world.groups.ensure(GROUP)[1]}
    world.repo.publish(
        name="digits-light", version=3, model_file=LIGHT_FP32, groups=group_key,
        profiles=["jetson-orin-nano", "rk3588"],
    )  # fmt: skip
    world.rollouts.start("digits-light", 3, GROUP, 100.0)
    transport = GatewayTransport()
    outcomes = world.updater(device, transport=transport).check()
    assert [(o.version, o.status) for o in outcomes] == [(3, "skipped")]
    assert "not for this device" in outcomes[0].detail
    assert "jetson-orin-nano, rk3588" in outcomes[0].detail
    assert "raspberry-pi-5" in outcomes[0].detail
    assert transport.blob_requests() == []  # not downloaded
    assert ("POST", "/v2/ota/report") not in transport.requests  # not a failure, not an attack
    assert_serves(world, device, 2)
    # published for several profiles, this device's among them: installed
    world.repo.publish(
        name="digits-light", version=4, model_file=LIGHT_FP32, groups=group_key,
        profiles=["jetson-orin-nano", "raspberry-pi-5"],
    )  # fmt: skip
    world.rollouts.start("digits-light", 4, GROUP, 100.0)
    outcome = world.updater(device).check()[0]
    assert (outcome.version, outcome.status) == (4, "installed")
    assert_serves(world, device, 4)


def test_which_profiles_a_target_is_for() -> None:
    assert not_for_profile({"profiles": []}, "raspberry-pi-5") is None
    assert not_for_profile({}, "raspberry-pi-5") is None
    assert not_for_profile({"profiles": ["raspberry-pi-5"]}, "raspberry-pi-5") is None
    assert "not for this device" in (
        not_for_profile({"profiles": ["rk3588"]}, "raspberry-pi-5") or ""
    )
    for malformed in ("raspberry-pi-5-and-more", [5], {"raspberry-pi-5": True}, None):
        assert "malformed" in (not_for_profile({"profiles": malformed}, "raspberry-pi-5") or "")


# -- going back: only on signed evidence ------------------------------------------------------------


def test_a_plan_naming_an_older_version_does_not_move_the_device(world: OtaWorld) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    world.updater(device).check()
    # a compromised gateway's plan: back to v2, which the signed metadata still offers
    forged = {"models": [{"name": "digits-light", "version": 2}]}
    transport = GatewayTransport(plan_answer(forged))
    outcome = world.updater(device, transport=transport).check()[0]
    assert outcome.status == "skipped"
    assert "does not withdraw v3" in outcome.detail
    assert_serves(world, device, 3)
    assert world.rollouts.device_status("cam-01", "digits-light", 3) == "installed"


def test_a_signed_withdrawal_takes_the_device_back(world: OtaWorld) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    world.updater(device).check()
    # the operator aborts every rollout of the model: the plan says v3 is withdrawn...
    world.rollouts.set_state("digits-light", None, None, "aborted")
    outcomes = world.updater(device).check()
    assert [(o.version, o.status) for o in outcomes] == [(3, "skipped")]
    assert "aborted the rollout of v3" in outcomes[0].detail
    assert "models withdraw" in outcomes[0].detail
    assert_serves(world, device, 3)  # ...but the signed metadata does not (yet)
    world.repo.withdraw("digits-light", 3)
    outcomes = world.updater(device).check()
    assert [(o.version, o.status) for o in outcomes if o.version == 3] == [(3, "rolled_back")]
    assert "withdrawn in the signed metadata: back to v2" in outcomes[0].detail
    assert_serves(world, device, 2)
    assert world.rollouts.device_status("cam-01", "digits-light", 3) == "rolled_back"
    # and it never goes back to v3, whatever a plan says
    forged = {"models": [{"name": "digits-light", "version": 3}]}
    transport = GatewayTransport(plan_answer(forged))
    outcome = world.updater(device, transport=transport).check()[0]
    assert outcome.status == "failed" and "withdrawn" in outcome.detail
    assert transport.blob_requests() == []
    assert_serves(world, device, 2)


def test_an_older_rollout_and_a_withdrawal_take_the_device_back(world: OtaWorld) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    world.updater(device).check()
    world.rollouts.set_state("digits-light", 3, GROUP, "aborted")  # v2's rollout is live
    assert world.updater(device).check()[0].status == "skipped"
    assert_serves(world, device, 3)
    world.repo.withdraw("digits-light", 3)
    outcome = world.updater(device).check()[0]
    assert (outcome.version, outcome.status) == (3, "rolled_back")
    assert_serves(world, device, 2)


def test_a_withdrawn_version_is_never_installed(world: OtaWorld) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    world.repo.withdraw("digits-light", 3)
    transport = GatewayTransport()
    outcome = world.updater(device, transport=transport).check()[0]
    assert outcome.status == "failed"
    assert "v3 is withdrawn in the signed metadata" in outcome.detail
    assert transport.blob_requests() == []
    assert_serves(world, device, 2)
    with pytest.raises(ConfigError, match="withdrawn already"):
        world.repo.withdraw("digits-light", 3)
    with pytest.raises(ConfigError, match="not published"):
        world.repo.withdraw("digits-light", 9)


def test_no_way_back_without_a_complete_previous_version(world: OtaWorld) -> None:
    device = first_install(world)  # v2 alone: no previous slot
    world.repo.withdraw("digits-light", 2)
    outcome = world.updater(device).check()[0]
    assert outcome.status == "skipped"
    assert "no complete previous version" in outcome.detail
    assert_serves(world, device, 2)


# -- the unsigned plan ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1]",
        b'{"models": 5}',
        b'{"models": [1]}',
        b'{"models": [{"name": "digits-light", "version": "x"}]}',
        b'{"models": [{"name": "digits-light", "version": true}]}',
        b'{"models": [{"name": "digits-light", "version": 0}]}',
        b'{"models": [{"name": "digits-light", "version": 1e3}]}',
        b'{"models": [{"name": "../../etc", "version": 2}]}',
        b'{"models": [{"name": null, "version": 2}]}',
        b'{"models": [{"name": "digits-light", "version": 2, "withdrawn": "yes"}]}',
        b"[" * 100_000,
    ],
)
def test_a_malformed_plan_is_refused_whole(world: OtaWorld, body: bytes) -> None:
    device = first_install(world)
    updater = world.updater(device, transport=GatewayTransport(plan_answer(body)))
    with pytest.raises(DownloadError, match="update plan"):
        updater.check()
    assert_serves(world, device, 2)


def test_an_endless_plan_is_cut_at_64_kib(world: OtaWorld) -> None:
    device = world.enroll("cam-01")
    sent = [0]

    def endless(request: httpx.Request) -> httpx.Response | None:
        if request.url.path != "/v2/ota/plan":
            return None

        def body() -> Iterator[bytes]:
            yield b'{"models": [], "pad": "'
            for _ in range(64):  # 64 MiB, if it were all read
                sent[0] += 1 << 20
                yield b"x" * (1 << 20)
            yield b'"}'

        return httpx.Response(200, content=body())

    updater = world.updater(device, transport=GatewayTransport(endless))
    with pytest.raises(DownloadError, match="over 65536 bytes"):
        updater.check()
    assert sent[0] <= 1 << 20  # it stopped at the first piece past the cap


def test_an_unexpected_error_fails_one_model_not_the_check(world: OtaWorld, tmp_path: Path) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    world.release("big", 1, big_package(tmp_path, 2))

    def on_step(step: str) -> None:
        if step == "tag-verified:digits-light:0":
            raise RuntimeError("a bug")

    outcomes = {o.name: o for o in world.updater(device, hooks={"on_step": on_step}).check()}
    assert outcomes["digits-light"].status == "failed"
    assert "unexpected error: RuntimeError('a bug')" in outcomes["digits-light"].detail
    assert outcomes["big"].status == "installed"
    assert_serves(world, device, 2)
    assert_serves(world, device, 1, name="big")


def test_the_background_updater_survives_any_error(world: OtaWorld) -> None:
    device = world.enroll("cam-01")
    calls: list[str] = []

    def on_step(step: str) -> None:
        calls.append(step)
        raise RuntimeError("a bug outside any one model")

    updater = world.updater(device, hooks={"on_step": on_step}, interval_s=0.02, jitter_s=0)
    thread = threading.Thread(target=updater.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    alive = thread.is_alive()
    updater.stop()
    thread.join(5)
    assert alive and len(calls) >= 3


def test_one_rule_for_model_names(world: OtaWorld) -> None:
    from edge_core.names import is_model_name

    for good in ("digits-light", "a", "v1.2_x", "A" * 128):
        assert is_model_name(good), good
    for bad in ("", ".", "..", "a..b", "-a", ".hidden", "a/b", "a\n", "A" * 129, "é", 7):
        assert not is_model_name(bad), bad
    with pytest.raises(ConfigError, match=r"model name '\.\./x'"):
        world.publish("../x", 1, LIGHT_INT8)
    with pytest.raises(ConfigError, match="group 'a/b'"):
        world.repo.publish(
            name="digits-light", version=5, model_file=LIGHT_INT8, groups={"a/b": b"k" * 32}
        )
    device = world.enroll("cam-01")
    store = world.store(device)
    (store.models / ".." / "escaped").mkdir()
    with pytest.raises(UpdateError, match="not a model name"):
        store.prepare("../escaped")
    assert store.active("../escaped") is None and store.previous("..") is None


# -- the slots: power cuts, smoke tests, locks ---------------------------------------------------


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
