"""Over-the-air updates against a real repository served over HTTP on loopback: the
formats, an install, profiles, going back only on signed evidence, the unsigned plan.

Every attack of the threat model is a test (test_ota_attacks.py), and each ends with
the device serving its current model (:func:`assert_serves`)."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from edge_agent.agent import Agent, LayeredSource
from edge_agent.assemble import OtaSource
from edge_agent.ota.updater import not_for_profile
from edge_agent.policy import load_policy
from edge_agent.profiles.state import DeviceState
from edge_core.errors import (
    ConfigError,
    DownloadError,
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
    LIGHT_FP32,
    LIGHT_INT8,
    PROFILE,
    Device,
    GatewayTransport,
    OtaWorld,
    assert_serves,
    big_package,
    first_install,
    plan_answer,
)
from tests.support.paths import MODELS, ROOT


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_no_way_back_without_a_complete_previous_version(world: OtaWorld) -> None:
    device = first_install(world)  # v2 alone: no previous slot
    world.repo.withdraw("digits-light", 2)
    outcome = world.updater(device).check()[0]
    assert outcome.status == "skipped"
    assert "no complete previous version" in outcome.detail
    assert_serves(world, device, 2)


# -- the unsigned plan ----------------------------------------------------------------------------


@pytest.mark.slow
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


@pytest.mark.slow
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
