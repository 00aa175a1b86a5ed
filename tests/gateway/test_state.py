"""The state database that replicas share: migrations, the files of a gateway from
before it, revocations seen by every replica within a second, the command line on one
URL, and a repository published atomically for replicas reading the same folder. Each
test on SQLite and on a real PostgreSQL (``state_url``)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cloud_gateway.auth import DeviceRegistry, mosquitto_hash
from cloud_gateway.config import GatewayConfig, load_config
from cloud_gateway.ota.rollouts import RolloutStore
from cloud_gateway.server import GatewayThread
from cloud_gateway.state import open_state
from edge_core.errors import ConfigError, Unauthenticated
from tests.support.paths import MODELS, ROOT


def old_state(folder: Path) -> str:
    """A state directory as a gateway from before the database left it; a token in it."""
    folder.mkdir(parents=True)
    token = "cam-09.an-old-token-from-the-json-registry"
    document = {
        "version": 1,
        "devices": {
            "cam-09": {
                "group": "rpi5-int8",
                "role": "device",
                "revoked": False,
                "created": "2026-01-01T00:00:00+00:00",
                "token_sha256": hashlib.sha256(token.encode()).hexdigest(),
                "mqtt_password": mosquitto_hash(token),
            },
            "old-02": {"group": "g", "token_sha256": "0" * 64, "revoked": True},
        },
    }
    (folder / "devices.json").write_text(json.dumps(document))
    old = sqlite3.connect(folder / "rollouts.sqlite")
    old.executescript(  # the first release's schema: no `started`, no `grp` in reports
        """
        CREATE TABLE rollouts (name TEXT, version INTEGER, grp TEXT, percent REAL, state TEXT,
            failure_threshold REAL, reason TEXT, created REAL, updated REAL,
            PRIMARY KEY (name, version, grp));
        CREATE TABLE reports (device TEXT, name TEXT, version INTEGER, status TEXT,
            detail TEXT, at REAL, PRIMARY KEY (device, name, version));
        CREATE TABLE seen (device TEXT PRIMARY KEY, at REAL, what TEXT);
        INSERT INTO rollouts VALUES ('digits-light', 2, 'rpi5-int8', 100, 'active', 0.2, '',
            1.0, 1.0);
        INSERT INTO reports VALUES ('cam-09', 'digits-light', 2, 'installed', '', 5.0);
        INSERT INTO seen VALUES ('cam-09', 1767225600.25, 'update check');
        """
    )
    old.commit()
    old.close()
    return token


def test_the_files_of_a_gateway_from_before_are_imported_once(
    tmp_path: Path,
    state_url: str,
) -> None:
    token = old_state(tmp_path / "gateway-state")
    database = open_state(state_url, legacy_dir=tmp_path / "gateway-state")
    registry = DeviceRegistry(database)
    assert registry.authenticate(token).group == "rpi5-int8"
    with pytest.raises(Unauthenticated):
        registry.authenticate("old-02.whatever")
    assert registry.mqtt_password("cam-09") is not None
    store = RolloutStore(database)
    assert store.stats("digits-light", 2, "rpi5-int8")["reported"] == 0  # no group then
    assert store.device_status("cam-09", "digits-light", 2) == "installed"
    assert store.plan("cam-09", "rpi5-int8") == {"digits-light": 2}
    assert store.last_seen()["cam-09"] == (1767225600.25, "update check")  # not a float32
    moved = sorted(p.name for p in (tmp_path / "gateway-state").iterdir())
    assert moved == ["devices.json.migrated", "rollouts.sqlite.migrated"]
    database.close()
    # opened again (another replica, a restart): nothing is imported twice
    again = open_state(state_url, legacy_dir=tmp_path / "gateway-state")
    assert len(DeviceRegistry(again).devices()) == 2
    again.close()


def test_a_wrong_state_url_fails_at_start(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('repository = "models"\nstate = "mysql://db/gateway"\n')
    with pytest.raises(ConfigError, match="expected sqlite:///FILE or postgresql://"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"the state database postgresql://nobody@"):
        open_state("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")


def replica(tmp: Path, url: str, name: str) -> GatewayThread:
    config = GatewayConfig(
        repository=tmp / "empty", state_dir=tmp / name, http_port=0, grpc_port=0,
        poll_interval_s=0.0, state=url,
    )  # fmt: skip
    (tmp / "empty").mkdir(exist_ok=True)
    return GatewayThread(config)


def status_of(thread: GatewayThread, token: str) -> int:
    request = urllib.request.Request(
        f"http://{thread.http_url}/v2", headers={"authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


@pytest.mark.slow
def test_a_revocation_anywhere_is_refused_by_every_replica_within_a_second(
    tmp_path: Path,
    state_url: str,
) -> None:
    token = DeviceRegistry.add_to(state_url, "cam-01", "g")
    replicas = [replica(tmp_path, state_url, name) for name in ("a", "b")]
    try:
        assert [status_of(r, token) for r in replicas] == [200, 200]
        # a third process (the operator's command line) revokes it
        DeviceRegistry(open_state(state_url)).revoke("cam-01")
        revoked = time.monotonic()
        refused: dict[int, float] = {}
        while len(refused) < 2 and time.monotonic() - revoked < 6:
            for index, thread in enumerate(replicas):
                if index not in refused and status_of(thread, token) == 401:
                    refused[index] = time.monotonic() - revoked
            time.sleep(0.02)
        assert sorted(refused) == [0, 1]
        # the replicas look every half second; on an idle machine this is well under a
        # second, and the bound leaves room for a CI machine busy with other tests
        assert max(refused.values()) < 3.0, refused
    finally:
        for thread in replicas:
            thread.stop()


def test_one_report_through_two_replicas_is_counted_once(state_url: str) -> None:
    first, second = RolloutStore(open_state(state_url)), RolloutStore(open_state(state_url))
    first.start("m", 3, "g", 100)
    threads = [
        threading.Thread(target=store.report, args=("d1", "g", "m", 3, "installed"))
        for store in (first, second, first, second)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert first.stats("m", 3, "g") == {
        "installed": 1, "failed": 0, "rolled_back": 0, "refused": 0, "reported": 1
    }  # fmt: skip


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cloud_gateway", "--state", url, *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip


@pytest.mark.slow
def test_the_command_line_works_against_the_state_url(
    tmp_path: Path,
    state_url: str,
) -> None:
    upgraded = cli(state_url, "--state-dir", str(tmp_path), "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    assert "schema at revision 0004" in upgraded.stdout
    assert "secret" not in upgraded.stdout
    added = cli(state_url, "--state-dir", str(tmp_path), "device", "add", "cam-3", "--group", "g")
    assert added.returncode == 0, added.stderr
    started = cli(
        state_url, "rollout", "start", "--name", "digits-light", "--version", "2",
        "--group", "g", "--percent", "10",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    # what the command line wrote, a gateway on the same URL serves
    thread = replica(tmp_path, state_url, "r")
    try:
        assert status_of(thread, added.stdout.strip()) == 200
    finally:
        thread.stop()
    assert RolloutStore(open_state(state_url)).get("digits-light", 2, "g") is not None


def test_a_replica_never_reads_a_half_published_target(tmp_path: Path) -> None:
    """Publishing while a replica reads the shared folder: every metadata file it finds
    parses, every target's bytes match the hash in its name."""
    from cloud_gateway.ota.groups import GroupKeys
    from cloud_gateway.ota.keys import KeyStore
    from cloud_gateway.ota.publish import OtaRepository

    keys = KeyStore(tmp_path / "keys")
    keys.init()
    repo = OtaRepository(tmp_path / "ota", keys)
    repo.init()
    _, public = GroupKeys(tmp_path / "state").ensure("g")
    done = threading.Event()
    seen: list[str] = []
    problems: list[str] = []

    def read_the_folder() -> None:
        while not done.is_set():
            # what the gateway serves (not the publisher's work folder beside them)
            served = [*(tmp_path / "ota" / "metadata").rglob("*")]
            served += (tmp_path / "ota" / "targets").rglob("*")
            for path in served:
                if not path.is_file() or path.name.startswith("."):
                    continue
                relative = path.relative_to(tmp_path / "ota")
                data = path.read_bytes()
                if relative.parts[0] == "metadata":
                    try:
                        json.loads(data)
                    except ValueError:
                        problems.append(f"{relative}: not whole")
                elif hashlib.sha256(data).hexdigest() != path.name.split(".")[0]:
                    problems.append(f"{relative}: bytes not those of its hash")
                seen.append(str(relative))

    reader = threading.Thread(target=read_the_folder)
    reader.start()
    try:
        package = MODELS / "digits-light" / "1"
        for version in (2, 3, 4):
            repo.publish(
                name="digits-light", version=version,
                model_file=package / "model.int8.onnx", groups={"g": public},
            )  # fmt: skip
    finally:
        done.set()
        reader.join()
    assert not problems, problems[:5]
    assert any(s.startswith("targets/models/digits-light/4/") for s in seen)
