"""The dashboard's test world: a real Mosquitto, a real gateway (MQTT bridge, OTA
repository, dashboard) and real agents (``edge-agent run`` processes on fake device
roots, telemetry and announcements over the broker, updates over HTTP), and a headless
Chromium driven by Selenium (Debian's ``chromium`` and ``chromium-driver``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloud_gateway import GatewayConfig, GatewayThread
from cloud_gateway.auth import DeviceRegistry
from cloud_gateway.config import DashboardSettings, MqttBridgeSettings
from cloud_gateway.mqtt.broker import ensure_gateway_password
from cloud_gateway.ota.groups import GroupKeys, write_bundle
from cloud_gateway.ota.publish import OtaRepository
from edge_core.processes import free_port, stop_process

from .broker import TestBroker
from .ota_world import signed_repository
from .paths import MODELS, ROOT
from .roots import make_root
from .services import need

__all__ = ["SCREENSHOTS", "Agent", "DashboardWorld", "chromium"]

GROUP = "rpi5-int8"
# Where each browser test saves its picture: the test's folder, or (`make screenshots`)
# the docs' images, as dashboard-<name>.png.
SCREENSHOTS = os.environ.get("DASHBOARD_SCREENSHOTS")


@dataclass
class Agent:
    id: str
    process: subprocess.Popen[bytes]
    http_port: int
    log: Path

    def stop(self) -> None:
        stop_process(self.process, 30)


@dataclass
class DashboardWorld:
    root: Path
    broker: TestBroker
    gateway: GatewayThread
    repo: OtaRepository
    groups: GroupKeys
    admin_token: str
    tokens: dict[str, str] = field(default_factory=dict)
    agents: dict[str, Agent] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.gateway.http_url}"

    @property
    def registry(self) -> DeviceRegistry:
        return self.gateway.gateway.registry

    def enroll(self, device_id: str, group: str = GROUP) -> str:
        token = self.registry.add(device_id, group)
        self.tokens[device_id] = token
        return token

    def publish(self, name: str, version: int, file: Path, group: str = GROUP) -> None:
        self.repo.publish(
            name=name,
            version=version,
            model_file=file,
            groups={group: self.groups.ensure(group)[1]},
        )

    def start_agent(self, device_id: str, *, temperature_c: float = 50.0) -> Agent:
        """``edge-agent run`` for an enrolled device, its thermal zone at ``temperature_c``
        (the Raspberry Pi 5 profile throttles at 80 °C)."""
        if device_id in self.agents:
            return self.agents[device_id]
        folder = self.root / "agents" / device_id
        root = make_root(folder / "root", cpus=2, temperatures={0: int(temperature_c * 1000)})
        private, _ = self.groups.ensure(GROUP)
        bundle = folder / "bundle.json"
        write_bundle(
            bundle, device_id=device_id, group=GROUP, token=self.tokens[device_id],
            group_private=private, trusted_root=self.repo.root_bytes(), gateway=self.url,
        )  # fmt: skip
        models = folder / "models"
        shutil.copytree(MODELS / "digits-light", models / "digits-light")
        port = free_port()
        config = folder / "agent.toml"
        config.write_text(
            f'device_id = "{device_id}"\nprofile = "raspberry-pi-5"\nroot = "{root}"\n'
            f'model_dir = "{models}"\nstate_dir = "{folder / "state"}"\n'
            "[privacy]\nface_detector = false\n"
            f"[api]\nhttp_port = {port}\ngrpc_port = 0\ndrain_s = 1\n"
            "[thermal]\ninterval_s = 0.2\nhysteresis_c = 5\n"
            f"[mqtt]\nport = {self.broker.port}\n"
            "[telemetry]\ninterval_s = 1\n"
            f'[ota]\nbundle = "{bundle}"\nurl = "{self.url}"\nstate_dir = "{folder / "ota"}"\n'
            "interval_s = 3600\njitter_s = 0\n"
        )
        log = folder / "agent.log"
        process = subprocess.Popen(
            [sys.executable, "-m", "edge_agent", "run", "--config", str(config)],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=open(log, "wb"),  # noqa: SIM115 - the child's
        )
        agent = Agent(device_id, process, port, log)
        self.agents[device_id] = agent
        return agent

    def start_agents(self) -> None:
        """cam-01 at 50 °C and cam-hot at 83 °C, past the Raspberry Pi 5's throttle point."""
        self.start_agent("cam-01")
        self.start_agent("cam-hot", temperature_c=83.0)

    def serving(self, device_id: str, name: str = "digits-light") -> int | None:
        """The version the agent itself says it serves (its local API)."""
        import httpx

        try:
            answer = httpx.get(
                f"http://127.0.0.1:{self.agents[device_id].http_port}/v2/models/{name}", timeout=5
            )
        except httpx.HTTPError:
            return None
        if answer.status_code != 200:
            return None
        versions = answer.json().get("versions") or []
        return int(versions[0]) if versions else None

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.stop()
        self.gateway.stop()
        self.broker.stop()


def make_world(root: Path) -> DashboardWorld:
    _, repo = signed_repository(root)
    state = root / "gateway-state"
    broker = TestBroker(root / "broker")
    broker.start()
    models = root / "models"
    shutil.copytree(MODELS / "digits-light", models / "digits-light")
    config = GatewayConfig(
        repository=models, state_dir=state, http_port=0, grpc_port=0, poll_interval_s=0.0,
        ota_repository=root / "ota", mqtt=MqttBridgeSettings(port=broker.port,
                                                              announce_interval_s=0.5),
        dashboard=DashboardSettings(refresh_s=1.0),
    )  # fmt: skip
    ensure_gateway_password(state / "mqtt-gateway.password")  # the broker is anonymous here
    admin = DeviceRegistry.add_to(config.state_url, "ops", "operators", role="admin")
    try:
        gateway = GatewayThread(config)
    except BaseException:
        broker.stop()
        raise
    return DashboardWorld(root, broker, gateway, repo, GroupKeys(state), admin)


def chromium(downloads: Path) -> Any:
    """A headless Chromium through Debian's chromedriver (the same version, both from
    the distribution's packages; `make test` installs them when missing)."""
    need("browser")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium") or "/usr/bin/chromium"
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    missing = [p for p in (binary, driver_path) if not Path(p).exists()]
    assert not missing, (
        f"{missing} missing: apt-get install chromium chromium-driver (make test does)"
    )
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in a container: Chromium's sandbox needs user namespaces
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,900",
        "--force-device-scale-factor=1",
        f"--user-data-dir={downloads}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver_path), options=options)
