"""The broker's set-up as docs/mqtt.md writes it, followed step by step, with Mosquitto
run as Debian runs it: started as root, it drops to the `mosquitto` account before it
reads its password and ACL files (which `cloud-gateway mqtt acl` once wrote root's,
0600: "Unable to open pwfile"). A device then signs in with its token, on the devices'
listener only, and cannot knock a gateway replica off by taking its client id; the
gateway signs in on its own listener only, two replicas at once.

The docs' paths are moved to a folder of this test's own that the `mosquitto` account
can reach (pytest's temporary folders are 0700), and removed at the end; `systemctl
restart mosquitto` becomes starting Mosquitto with a configuration like Debian's (which
includes conf.d/)."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edge_core.processes import free_port, stop_process
from tests.support.paths import ROOT


def debian_broker() -> bool:
    try:
        pwd.getpwnam("mosquitto")
        grp.getgrnam("mosquitto")
    except KeyError:
        return False
    return os.geteuid() == 0 and shutil.which("mosquitto") is not None


pytestmark = [
    pytest.mark.broker,
    pytest.mark.skipif(
        not debian_broker(), reason="needs root and Debian's mosquitto (its account and group)"
    ),
]


def docs_block() -> str:
    page = (ROOT / "docs" / "mqtt.md").read_text()
    start = page.index("<!-- broker-setup")
    block = page[page.index("```sh\n", start) + 6 :]
    return block[: block.index("```")]


def connect(port: int, username: str, password: str, client_id: str = "") -> int:
    """The broker's CONNACK reason code for these credentials (0: accepted)."""
    answers: list[int] = []
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id, protocol=mqtt.MQTTv5)
    client.username_pw_set(username, password)
    client.on_connect = lambda c, u, f, reason, p: answers.append(reason.value)
    client.connect("127.0.0.1", port)
    end = time.monotonic() + 10
    while not answers and time.monotonic() < end:
        client.loop(0.1)
    client.disconnect()
    assert answers, "no CONNACK"
    return answers[0]


class Replica:
    """A gateway replica's connection (its user, an id of its own), counting drops."""

    def __init__(self, port: int, password: str, client_id: str) -> None:
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id, protocol=mqtt.MQTTv5)
        self.client.username_pw_set("_gateway", password)
        self.connacks: list[int] = []
        self.drops = 0
        self.client.on_connect = lambda c, u, f, reason, p: self.connacks.append(reason.value)
        self.client.on_disconnect = lambda *args: setattr(self, "drops", self.drops + 1)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        end = time.monotonic() + 10
        while not self.connacks and time.monotonic() < end:
            time.sleep(0.02)
        assert self.connacks == [0], self.connacks

    def round_trip(self) -> None:
        """A QoS 1 publish and its PUBACK: after it, a disconnect before it is counted."""
        info = self.client.publish("fleet/setup-test/models", b"{}", qos=1)
        info.wait_for_publish(timeout=10)
        assert info.is_published()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_the_documented_broker_setup_works_with_a_broker_that_drops_root(
    tmp_path: Path,
) -> None:
    base = Path(f"/var/lib/edge-broker-test-{uuid.uuid4().hex[:8]}")
    port, gateways = free_port(), free_port()
    try:
        for folder in ("state", "fleet", "conf.d", "persist"):
            (base / folder).mkdir(parents=True)
        base.chmod(0o755)
        shutil.chown(base / "persist", "mosquitto", "mosquitto")
        script = (
            docs_block()
            .replace("/srv/gateway-state", str(base / "state"))
            .replace("/etc/mosquitto/fleet", str(base / "fleet"))
            .replace("/etc/mosquitto/conf.d", str(base / "conf.d"))
            .replace("listener 1883", f"listener {port} 127.0.0.1")
            .replace("listener 1884", f"listener {gateways} 127.0.0.1")
        )
        stubs = (
            f'cloud-gateway() {{ {sys.executable} -m cloud_gateway "$@"; }}\n'
            f'systemctl() {{ echo "systemctl $*" >> {tmp_path / "calls"}; }}\n'
        )
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", stubs + script],
            cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "readable by group mosquitto" in done.stdout
        assert (tmp_path / "calls").read_text() == "systemctl restart mosquitto\n"
        passwd = base / "fleet" / "passwd"
        assert oct(passwd.stat().st_mode & 0o777) == "0o640"
        assert grp.getgrgid(passwd.stat().st_gid).gr_name == "mosquitto"
        main_conf = base / "mosquitto.conf"  # as Debian's /etc/mosquitto/mosquitto.conf
        main_conf.write_text(
            f"persistence true\npersistence_location {base / 'persist'}/\n"
            f"log_dest file {base / 'persist' / 'mosquitto.log'}\n"
            f"include_dir {base / 'conf.d'}\n"
        )
        broker = subprocess.Popen(
            ["mosquitto", "-c", str(main_conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            end = time.monotonic() + 10
            while True:
                assert broker.poll() is None, broker.stderr.read().decode()  # type: ignore[union-attr]
                try:
                    token = (tmp_path / "cam-01.token").read_text().strip()
                    assert connect(port, "cam-01", token) == 0  # accepted
                    break
                except ConnectionRefusedError:
                    assert time.monotonic() < end, "the broker did not listen"
                    time.sleep(0.1)
            assert connect(port, "cam-01", "not-the-token") != 0  # refused
            assert connect(gateways, "cam-01", token) != 0  # not on the gateways' listener
            password = (base / "state" / "mqtt-gateway.password").read_text().strip()
            assert connect(port, "_gateway", password) != 0  # nor a gateway on the devices'
            replicas = [Replica(gateways, password, f"_gateway-{i}") for i in range(2)]
            try:  # a device that asks for a replica's id gets its own: the replica stays
                assert connect(port, "cam-01", token, client_id="_gateway-0") == 0
                for replica in replicas:
                    replica.round_trip()
                assert [r.drops for r in replicas] == [0, 0]
                assert all(r.client.is_connected() for r in replicas)
            finally:
                for replica in replicas:
                    replica.close()
            owner = pwd.getpwuid(int(Path(f"/proc/{broker.pid}/status").read_text()
                                     .split("Uid:")[1].split()[0])).pw_name  # fmt: skip
            assert owner == "mosquitto"  # it dropped root, and read its files all the same
        finally:
            stop_process(broker)
    finally:
        shutil.rmtree(base, ignore_errors=True)
