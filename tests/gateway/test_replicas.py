"""Two gateway replicas on one PostgreSQL, behind HAProxy, with one broker: the
deployment of docs/deployment.md, its own files (``deploy/haproxy.cfg``,
``deploy/mosquitto.conf``), and one replica killed with SIGKILL under load."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from cloud_gateway.auth import DeviceRegistry
from edge_agent.offload import OffloadClient, make_transport, make_transports
from edge_agent.offload.breaker import CircuitBreaker
from edge_core.errors import EdgeError
from edge_core.processes import stop_process
from edge_core.protocol.types import InferRequest
from edge_core.repository import ModelRepository
from tests.support.paths import MODELS, ROOT
from tests.support.postgres import PostgresCluster
from tests.support.replicas import Replica, start_haproxy, start_mosquitto, start_replica

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.haproxy]

DEVICES = ("cam-01", "cam-02", "cam-03", "cam-04", "cam-05")


def request_for(x: np.ndarray) -> InferRequest:
    return InferRequest(
        inputs={"pixels": x}, datatypes={"pixels": "FP32"}, model_name="digits-light"
    )


def call(url: str, path: str, token: str, body: dict[str, object] | None = None) -> object:
    request = urllib.request.Request(
        f"http://{url}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def cli(url: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "cloud_gateway", "--state", url, *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=True,
    )  # fmt: skip
    return done.stdout


def test_two_replicas_behind_haproxy_survive_a_kill_9(
    tmp_path: Path,
    postgres: PostgresCluster,
) -> None:
    url = postgres.database()
    tokens = {device: DeviceRegistry.add_to(url, device, "g") for device in DEVICES}
    repository = tmp_path / "models"
    repository.mkdir()
    (repository / "digits-light").symlink_to(MODELS / "digits-light")
    (tmp_path / "ota").mkdir()  # the OTA repository every replica reads (a shared volume)
    # the broker's files from the shared registry, and one password for both replicas
    password = tmp_path / "mqtt-gateway.password"
    cli(url, "--config", str(_settings(tmp_path, url, 1, repository, password)), "mqtt", "acl",
        "--out", str(tmp_path / "broker"))  # fmt: skip
    replicas: list[Replica] = []
    haproxy = broker = None
    try:
        broker, broker_port, gateways_port = start_mosquitto(tmp_path, tmp_path / "broker")
        settings = _settings(tmp_path, url, gateways_port, repository, password).read_text()
        replicas += [start_replica(tmp_path, name, settings) for name in ("a", "b")]
        haproxy, http_port, grpc_port = start_haproxy(tmp_path, *replicas)
        balancer = f"127.0.0.1:{http_port}"
        # a rollout started through the command line reaches devices polling either
        # replica, or the balancer
        cli(url, "rollout", "start", "--name", "digits-light", "--version", "2",
            "--group", "g", "--percent", "100")  # fmt: skip
        for where in (replicas[0].http_url, replicas[1].http_url, balancer):
            plan = call(where, "/v2/ota/plan", tokens["cam-01"])
            assert [(m["name"], m["version"]) for m in plan["models"]] == [("digits-light", 2)]  # type: ignore[index]
        # a report sent through each replica (a device that retried) is counted once
        report = {"name": "digits-light", "version": 2, "status": "installed", "serving": 2}
        for replica in replicas:
            call(replica.http_url, "/v2/ota/report", tokens["cam-02"], report)
        status = cli(url, "rollout", "status")
        assert "installed 1, failed 0" in status, status

        # agents under load: over HTTP through HAProxy, over gRPC with both replicas in
        # their [gateway] address list
        x = ModelRepository(MODELS).get("digits-light").evaluation()[0][:1].astype(np.float32)
        clients = {
            "cam-01": make_transport("http", balancer, token=tokens["cam-01"]),
            "cam-02": make_transport("http", balancer, token=tokens["cam-02"]),
            "cam-03": make_transports(
                "grpc", (replicas[0].grpc_url, replicas[1].grpc_url), token=tokens["cam-03"]
            ),
            "cam-04": make_transports(
                "grpc", (replicas[1].grpc_url, replicas[0].grpc_url), token=tokens["cam-04"]
            ),
        }
        # and a device offloading over MQTT, through the replicas' shared subscription
        mqtt = _mqtt_transport(broker_port, "cam-05", tokens["cam-05"])
        assert mqtt.infer(request_for(x), timeout=5).outputs
        stop = threading.Event()
        counts = {device: [0, 0] for device in clients}  # [answered, failed]
        failures: list[str] = []
        after_kill = dict.fromkeys(clients, 0)
        killed = threading.Event()

        def agent(device: str) -> None:
            offload = OffloadClient(
                clients[device],
                retries=3,
                backoff_s=0.05,
                breaker=CircuitBreaker(failures=1000, cooldown_s=1.0),
            )
            while not stop.is_set():
                try:
                    offload.infer(request_for(x), deadline=time.monotonic() + 3.0)
                    counts[device][0] += 1
                    if killed.is_set():
                        after_kill[device] += 1
                except EdgeError as exc:
                    counts[device][1] += 1
                    failures.append(f"{device}: {exc}")

        threads = [threading.Thread(target=agent, args=(d,)) for d in clients]
        for thread in threads:
            thread.start()
        time.sleep(2.0)
        replicas[0].kill()  # halfway: kill -9, no goodbye
        killed.set()
        time.sleep(3.0)
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        assert not failures, failures[:5]
        assert all(n > 0 for n in after_kill.values()), (counts, after_kill)
        # the broker hands the shared subscription's requests to the survivor alone (one
        # in flight to the killed replica when it died would be lost: at most once, and
        # the agent answers it locally, as when the cloud is down)
        for _ in range(3):
            assert mqtt.infer(request_for(x), timeout=5).outputs
        # the surviving replica still serves the rollout, and counts the report once
        plan = call(balancer, "/v2/ota/plan", tokens["cam-03"])
        assert plan["models"][0]["version"] == 2  # type: ignore[index]
        call(balancer, "/v2/ota/report", tokens["cam-02"], report)
        assert "installed 1, failed 0" in cli(url, "rollout", "status")
        print(f"answered, failed per device: {counts}; after the kill: {after_kill}")
    finally:
        for transport in [*clients.values(), mqtt] if "mqtt" in locals() else ():
            transport.close()
        if haproxy is not None:
            stop_process(haproxy)
        for replica in replicas:
            if replica.process.poll() is None:
                replica.stop()
        if broker is not None:
            stop_process(broker)


def _settings(tmp: Path, url: str, broker_port: int, repository: Path, password: Path) -> Path:
    path = tmp / "replica-settings.toml"
    path.write_text(
        f'repository = "{repository}"\nstate = "{url}"\nota_repository = "{tmp / "ota"}"\n'
        "poll_interval_s = 0.5\n"
        f'[mqtt]\nport = {broker_port}\npassword_file = "{password}"\n'
    )
    return path


def _mqtt_transport(port: int, device: str, token: str):  # type: ignore[no-untyped-def]
    from edge_agent.mqtt import MqttConnection
    from edge_agent.offload.mqtt import MqttTransport
    from edge_core.mqtt import MqttSettings

    connection = MqttConnection(
        MqttSettings(port=port, username=device, password=token), device_id=device
    )
    transport = MqttTransport(connection, token=token)
    connection.start()
    assert connection.wait_connected(10)
    return transport
