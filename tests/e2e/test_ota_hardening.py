"""The update path under abuse: servers that drip bytes, signed lengths no device can
hold, packages that inflate when read, bytes corrupted in transit, packages that are
not what their metadata says. Each ends with the device serving a valid model.

Through the OTA test world (the real gateway over uvicorn, attacks at the updater's
transport seam, metadata re-signed with the repository's own keys where the attack
takes the signing key)."""

from __future__ import annotations

import json
import os
import threading
import time
import tracemalloc
from pathlib import Path

import httpx
import pytest

from cloud_gateway.ota.archive import package_archive
from edge_agent.config import OtaSettings, load_agent_config
from edge_agent.ota import UpdateOutcome
from edge_agent.ota.fetch import Pace, RateWatch
from edge_agent.ota.install import lacks_room
from edge_core.errors import ConfigError, DownloadStalled
from edge_core.ota.plan import payload_target
from tests.support.ota_world import (
    GROUP,
    LIGHT_FP32,
    Device,
    DrippingTransport,
    GatewayTransport,
    OtaWorld,
    assert_serves,
    big_package,
    first_install,
    run_installer,
)
from tests.support.packages import with_sparse_member


def still_active(world: OtaWorld, name: str, version: int) -> None:
    """A refusal pauses no rollout (one device's path says nothing of the model) and
    blocks nothing on the device: a ``failed`` version would not be offered again."""
    rollout = world.rollouts.get(name, version, GROUP)
    assert rollout is not None and rollout.state == "active", rollout


def offering_big(world: OtaWorld, tmp_path: Path, megabytes: int) -> Device:
    """A device running digits-light v2, offered "big" v1 (a package of ``megabytes``)."""
    device = first_install(world)
    world.release("big", 1, big_package(tmp_path, megabytes))
    return device


def signed_blob(world: OtaWorld, name: str, version: int) -> tuple[str, int]:
    """The SHA-256 and length the current signed metadata gives a version's blob."""
    info = world.repo.targets()[payload_target(name, version)]
    return info.hashes["sha256"], info.length


# -- item 8: a minimum rate and a deadline on every download ----------------------------------


def test_the_pace_of_a_download() -> None:
    pace = Pace(min_rate=1000, window_s=10.0)
    assert pace.deadline(100.0, 50_000) == 100.0 + 10.0 + 50.0
    assert Pace().deadline(100.0, 10**12) == float("inf")  # no minimum: no deadline
    watch = RateWatch(pace, 0.0, pace.deadline(0.0, 50_000))
    assert watch.lag(500, 9.9) is None  # within the first window: not judged yet
    assert watch.lag(20_000, 10.0) is None  # 2,000 bytes/s: a new window starts
    assert watch.lag(25_000, 20.0) == (
        "500 bytes/s over the last 10.0 s, below the minimum of 1000 bytes/s"
    )
    late = RateWatch(pace, 0.0, 60.0)
    assert late.lag(49_999, 60.5) == "past its deadline of 60.0 s"
    assert late.timeout(30.0, 45.0) == 15.0  # a read never waits past the deadline
    assert RateWatch(Pace(), 0.0, float("inf")).lag(0, 10**6) is None


@pytest.mark.slow
def test_a_blob_served_at_a_trickle_is_abandoned_the_lock_released_and_resumed(
    world: OtaWorld, tmp_path: Path
) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    world.updater(device).check()  # v3 runs, v2 is kept: an operator can go back to it
    world.release("big", 1, big_package(tmp_path, 1))
    drip = DrippingTransport(lambda path: "/targets/models/big/" in path, rate=100, for_s=20)
    updater = world.updater(device, transport=drip, min_rate=1000, rate_window_s=1.0)
    outcomes: dict[str, UpdateOutcome] = {}
    check = threading.Thread(
        target=lambda: outcomes.update((o.name, o) for o in updater.check()), daemon=True
    )
    check.start()
    assert drip.dripping.wait(30), "the blob never started to drip"
    started = time.monotonic()
    # `edge-agent models rollback` waits for the update lock: only as long as the pace allows
    assert world.updater(device).rollback("digits-light").version == 2
    waited = time.monotonic() - started
    check.join(30)
    assert waited < 8.0, f"the rollback waited {waited:.1f} s behind a dripping download"
    big = outcomes["big"]
    assert big.status == "refused", big.detail
    assert "below the minimum of 1000 bytes/s" in big.detail
    assert "kept for the next check to resume" in big.detail
    assert world.rollouts.device_status(device.id, "big", 1) == "refused"  # not blocked
    sha, length = signed_blob(world, "big", 1)
    part = world.store(device).downloads / f"{sha}.part"
    kept = part.stat().st_size
    assert 0 < kept < length
    # the next check resumes from the bytes kept
    still_active(world, "big", 1)
    transport = GatewayTransport()
    outcome = [o for o in world.updater(device, transport=transport).check() if o.name == "big"]
    assert [o.status for o in outcome] == ["installed"]
    [path] = [p for p in transport.ranges if "/targets/models/big/" in p]
    assert transport.ranges[path] == [f"bytes={kept}-"]
    assert_serves(world, device, 1, name="big")
    assert_serves(world, device, 2)


@pytest.mark.slow
def test_metadata_served_at_a_trickle_is_abandoned(world: OtaWorld) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    drip = DrippingTransport(lambda path: path.endswith("/timestamp.json"), rate=50, for_s=20)
    updater = world.updater(device, transport=drip, min_rate=1000, rate_window_s=1.0)
    started = time.monotonic()
    with pytest.raises(DownloadStalled, match=r"timestamp\.json.*below the minimum"):
        updater.check()
    assert time.monotonic() - started < 8.0  # not the ~25 s the whole file would take
    assert_serves(world, device, 2)
    assert world.updater(device).check()[0].status == "installed"  # at a decent pace
    assert_serves(world, device, 3)


def test_the_pace_is_read_from_the_config(tmp_path: Path) -> None:
    def ota(body: str) -> OtaSettings:
        path = tmp_path / "agent.toml"
        path.write_text(f'[ota]\nbundle = "b.json"\n{body}')
        settings = load_agent_config(path).ota
        assert settings is not None
        return settings

    defaults = ota("")
    assert (defaults.min_rate, defaults.rate_window_s) == (4096, 60.0)
    assert (defaults.max_model_bytes, defaults.min_free_bytes) == (2 << 30, 64 << 20)
    read = ota("min_rate = 0\nrate_window_s = 5\nmax_model_bytes = 1000\nmin_free_bytes = 0\n")
    assert (read.min_rate, read.rate_window_s, read.max_model_bytes) == (0, 5.0, 1000)
    with pytest.raises(ConfigError, match=r"ota\.min_rate: expected at most bandwidth"):
        ota("bandwidth = 1000\nmin_rate = 4096\n")


# -- item 9: a signed length the device cannot hold --------------------------------------------


@pytest.mark.slow
def test_a_signed_length_the_device_cannot_hold_is_refused_before_any_download(
    world: OtaWorld,
) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    world.resign("digits-light", 3, length=10**15)  # a petabyte, signed
    transport = GatewayTransport()
    outcome = world.updater(device, transport=transport).check()[0]
    assert outcome.status == "refused"
    assert "over this device's maximum model size of 2147483648 bytes" in outcome.detail
    # allowed that large, it still does not fit on the disk
    still_active(world, "digits-light", 3)
    roomy = world.updater(device, transport=transport, max_model_bytes=10**16)
    outcome = roomy.check()[0]
    assert outcome.status == "refused"
    assert f"it needs {10**15} more bytes on a filesystem with" in outcome.detail
    assert "free some space" in outcome.detail
    assert not [path for _, path in transport.requests if "/v2/ota/targets/" in path]
    assert not list(world.store(device).downloads.glob("*.part"))
    assert world.rollouts.device_status(device.id, "digits-light", 3) == "refused"
    assert_serves(world, device, 2)


@pytest.mark.slow
def test_a_disk_that_fills_during_the_download_is_a_reported_refusal(
    world: OtaWorld, tmp_path: Path
) -> None:
    device = offering_big(world, tmp_path, 3)
    # the file-size limit drops to 1 MiB once the download is about to start
    full = run_installer(device, world.url, "--file-limit-at", "key", "--file-limit", str(1 << 20))
    big = next(o for o in json.loads(full.stdout) if o["name"] == "big")
    assert big["status"] == "refused", full.stderr[-500:]
    assert "File too large" in big["detail"] and "what was written is removed" in big["detail"]
    assert "unexpected" not in big["detail"]
    assert not list(world.store(device).downloads.glob("*.part"))
    assert world.rollouts.device_status(device.id, "big", 1) == "refused"
    # with room again, the next check installs it
    still_active(world, "big", 1)
    assert run_installer(device, world.url).returncode == 0
    assert_serves(world, device, 1, name="big")
    assert_serves(world, device, 2)


def test_what_room_a_download_needs() -> None:
    def why(**changes: int | None) -> str:
        room = {"length": 1000, "plaintext_length": 900, "have": 0, "free": 10_000}
        limits = {"file_limit": None, "max_bytes": 5000, "min_free": 1000}
        return lacks_room(**{**room, **limits, **changes}) or ""  # type: ignore[arg-type]

    assert why() == ""
    assert "maximum model size of 5000 bytes" in why(plaintext_length=6000)  # in memory
    assert "file-size limit of 999 bytes" in why(file_limit=999)
    assert "needs 1000 more bytes on a filesystem with 1999 free" in why(free=1999)
    assert why(free=1500, have=500) == ""  # a resumed download needs only the rest


# -- item 10: a package that inflates when read ------------------------------------------------


@pytest.mark.slow
def test_a_sparse_member_is_refused_before_it_is_read(world: OtaWorld, tmp_path: Path) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    archive, _ = package_archive(LIGHT_FP32, "digits-light", 3, tmp_path)
    inflating = with_sparse_member(archive.read_bytes(), "weights.bin", 256 << 20)
    assert len(inflating) < archive.stat().st_size + 2048  # 256 MiB in 512 bytes
    world.reseal("digits-light", 3, inflating)  # signed: it takes the publisher's key
    tracemalloc.start()
    try:
        outcome = world.updater(device).check()[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert outcome.status == "failed"
    assert "archive member 'weights.bin' is a sparse file, not a regular file" in outcome.detail
    assert peak < 64 << 20, f"the check's memory peaked at {peak >> 20} MiB"
    assert_serves(world, device, 2)


@pytest.mark.slow
def test_the_signed_plaintext_length_is_enforced(world: OtaWorld) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    custom = world.repo.targets()[payload_target("digits-light", 3)].custom
    world.resign("digits-light", 3, plaintext_length=custom["plaintext_length"] - 1)
    outcome = world.updater(device).check()[0]
    assert outcome.status == "refused"
    assert "plaintext, but its signed metadata says" in outcome.detail
    assert_serves(world, device, 2)


# -- item 11: an integrity failure of a download is a refusal, retried ------------------------


@pytest.mark.slow
def test_a_resume_over_the_wrong_bytes_is_refused_and_retried(
    world: OtaWorld, tmp_path: Path
) -> None:
    device = offering_big(world, tmp_path, 1)
    sha, length = signed_blob(world, "big", 1)
    part = world.store(device).downloads / f"{sha}.part"
    part.write_bytes(world.payload_file("big", 1).read_bytes()[:4096])  # a cut download

    def wrong_bytes(request: httpx.Request) -> httpx.Response | None:
        asked = request.headers.get("range")
        if "/targets/models/big/" not in request.url.path or asked is None:
            return None
        start = int(asked.removeprefix("bytes=").rstrip("-"))
        headers = {"content-range": f"bytes {start}-{length - 1}/{length}"}
        return httpx.Response(206, headers=headers, content=os.urandom(length - start))

    transport = GatewayTransport(wrong_bytes)
    outcomes = world.updater(device, transport=transport).check()
    [big] = [o for o in outcomes if o.name == "big"]
    assert big.status == "refused"
    assert "does not match the signed length and hash" in big.detail
    assert world.rollouts.device_status(device.id, "big", 1) == "refused"
    assert not part.exists()
    # nothing blocks it: the next check downloads it whole and installs it
    still_active(world, "big", 1)
    outcomes = world.updater(device).check()
    assert [o.status for o in outcomes if o.name == "big"] == ["installed"]
    assert_serves(world, device, 1, name="big")


@pytest.mark.slow
def test_a_blob_failing_its_tags_is_removed(world: OtaWorld) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)
    blob = bytearray(world.payload_file("digits-light", 3).read_bytes())
    blob[100] ^= 1  # in the first chunk, and signed so: its hash matches the metadata
    world.resign("digits-light", 3, blob=bytes(blob))
    steps: list[str] = []
    outcome = world.updater(device, hooks={"on_step": steps.append}).check()[0]
    assert "hash-verified" in steps
    assert outcome.status == "refused" and "fails its authentication tag" in outcome.detail
    assert not list(world.store(device).downloads.glob("*.part"))
    assert_serves(world, device, 2)


# -- item 13: the signed variant ----------------------------------------------------------------


@pytest.mark.slow
def test_a_package_of_another_variant_than_signed_is_refused(world: OtaWorld) -> None:
    device = first_install(world)
    world.release("digits-light", 3, LIGHT_FP32)  # tflite-fp32
    int8 = {"id": "tflite-int8", "format": "tflite", "precision": "int8"}
    world.resign("digits-light", 3, variant=int8)
    outcome = world.updater(device).check()[0]
    assert outcome.status == "refused"
    assert "variant is tflite-fp32, but its signed metadata says 'tflite-int8'" in outcome.detail
    assert_serves(world, device, 2)
