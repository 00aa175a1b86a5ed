"""Every attack of the OTA threat model against a real repository on loopback, each
ending with the device serving its current model (:func:`assert_serves`); and
compression bombs: only unencoded bodies, limits on the bytes on the wire."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from cloud_gateway.ota.keys import KeyStore
from cloud_gateway.ota.publish import OtaRepository, due_roles
from cloud_gateway.server import GatewayThread
from edge_agent.ota.fetch import download_resumable, fetch_plan
from edge_agent.ota.signed import refresh
from edge_core.errors import (
    DownloadError,
    MetadataError,
    ModelNotFoundError,
)
from tests.support.ota_world import (
    GROUP,
    LIGHT_FP32,
    LIGHT_INT8,
    PROFILE,
    CuttingProxy,
    EncodingServer,
    GatewayTransport,
    OtaWorld,
    assert_serves,
    big_package,
    broken_package,
    compress,
    first_install,
)

# -- the attacks ---------------------------------------------------------------------------------


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_mix_and_match_is_refused(world: OtaWorld) -> None:
    device = first_install(world)
    older_targets = metadata(world, "targets").read_bytes()
    world.release("digits-light", 3, LIGHT_FP32)
    metadata(world, "targets").write_bytes(older_targets)  # the new snapshot, with old targets
    with pytest.raises(MetadataError):
        world.updater(device).check()
    assert_serves(world, device, 2)


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_model_failing_its_smoke_test_is_rolled_back_and_reported(
    world: OtaWorld, tmp_path: Path
) -> None:
    device = first_install(world)
    world.release("digits-light", 3, broken_package(tmp_path))
    outcome = world.updater(device).check()[0]
    assert outcome.status == "failed" and "off the golden output" in outcome.detail
    assert world.rollouts.device_status("cam-01", "digits-light", 3) == "failed"
    assert_serves(world, device, 2)


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_key_rotation_is_followed(world: OtaWorld) -> None:
    device = first_install(world)
    world.repo.rotate("targets")
    world.repo.rotate("root")
    world.release("digits-light", 3, LIGHT_FP32)
    assert world.updater(device).check()[0].status == "installed"
    assert_serves(world, device, 3)
    cached_root = json.loads((device.state / "ota" / "tuf" / "root.json").read_text())
    assert cached_root["signed"]["version"] == 3


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
