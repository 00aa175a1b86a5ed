"""The demo on loopback: the operator, the cloud gateway, the edge agent, requests
through the agent, an update over the air, the gateway going away, the summary.

(Over 400 lines: the demo's story in the order it is told, one method a scene.)"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_core.processes import free_port
from edge_core.protocol.rest import HEADER_LENGTH, decode_infer_response, encode_infer_request
from edge_core.protocol.types import InferRequest
from edge_core.report import render_table

from .common import (
    MODELS,
    ROOT,
    Array,
    DemoError,
    Describe,
    Processes,
    TelemetryWatcher,
)
from .inputs import Inputs, digit, text_map

GROUP = "demo"
DEVICE = "cam-01"
NEW_VERSION = 2
REQUEST_TIMEOUT_US = 5_000_000  # the protocol's `timeout`: generous, for a busy 2-core machine
READY_TIMEOUT_S = 120.0
CPUINFO = "".join(
    f"processor\t: {n}\nFeatures\t: fp asimd aes pmull sha1 sha2 crc32 atomics asimddp\n"
    "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd0b\n\n"
    for n in range(4)
)


@dataclass
class Step:
    """One request through the agent and what came back."""

    what: str
    model: str
    label: str
    action: str = ""
    reason: str = "-"
    where: str = "-"
    answered_by: str = "-"
    answer: str = "-"
    latency_ms: float = 0.0
    note: str = ""  # what to read in it, under the table


class Demo:
    def __init__(self, work: Path, stack: ExitStack, mqtt: bool) -> None:
        self.work = work
        self.stack = stack
        self.mqtt = mqtt
        self.processes = Processes()
        stack.callback(self.processes.stop_all)
        self.steps: list[Step] = []
        self.versions: dict[str, int | None] = {}
        self.update_note = ""
        self.gateway_http, self.gateway_grpc, self.agent_http = free_port(), free_port(), 0
        self.broker: Any = None  # benchmarks.agent.mosquitto.Mosquitto, with MQTT
        self.watcher: TelemetryWatcher | None = None

    # -- commands ------------------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT), **extra}
        if "NOTIFY_SOCKET" not in extra:
            env.pop("NOTIFY_SOCKET", None)  # were the demo run by systemd: not for the tools
        return env

    def shown(self, text: str) -> str:
        return text.replace(f"{self.work}/", "").replace(f"{ROOT}/", "")

    def run_gateway_cli(self, *args: str, echo: bool = True) -> str:
        """``cloud-gateway --config gateway.toml ARGS`` in the demo's folder, as an operator."""
        if echo:
            print("$ cloud-gateway " + " ".join(self.shown(a) for a in args), flush=True)
        result = subprocess.run(
            [sys.executable, "-m", "cloud_gateway", "--config", "gateway.toml", *args],
            cwd=self.work, env=self.env(), stdin=subprocess.DEVNULL, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        if result.returncode != 0:
            raise DemoError(f"cloud-gateway {' '.join(args[:2])} failed:\n{result.stderr.strip()}")
        return result.stdout

    def operator(self, *args: str) -> None:
        for line in self.run_gateway_cli(*args).strip().splitlines():
            print(f"  {self.shown(line)}")

    # -- the operator --------------------------------------------------------------------------

    def set_up(self) -> None:
        print("== the operator: signing keys, devices, the OTA repository")
        cloud = self.work / "cloud-models"
        cloud.mkdir()
        for name in ("digits-heavy", "ppocr-det"):  # the cloud-only models of the policy
            (cloud / name).symlink_to(MODELS / name)
        mqtt = ""
        if self.mqtt:
            from benchmarks.agent.mosquitto import Mosquitto

            broker = self.work / "broker"
            self.broker = Mosquitto(
                broker, passwd=broker / "passwd", gateway_passwd=broker / "gateway-passwd",
                acl=broker / "acl",
            )  # fmt: skip
            mqtt = f"[mqtt]\nport = {self.broker.gateway_port}\nannounce_interval_s = 0.5\n"
        (self.work / "gateway.toml").write_text(
            'repository = "cloud-models"\nstate_dir = "gateway-state"\nota_repository = "ota"\n'
            f"http_port = {self.gateway_http}\ngrpc_port = {self.gateway_grpc}\n"
            f"poll_interval_s = 0\nworkers = 1\n{mqtt}"
        )
        self.operator("keys", "init", "--dir", "keys")
        # the group's key comes with its first device, and the first publish makes the OTA
        # repository, whose trusted root goes into the next devices' enrollment bundles
        self.run_gateway_cli("device", "add", "cam-02", "--group", GROUP)
        print("  cam-02 enrolled (its token is printed once; not shown here)")
        self.publish(1)
        self.run_gateway_cli(
            "device", "add", DEVICE, "--group", GROUP, "--repository", "ota",
            "--bundle", f"{DEVICE}.json",
        )  # fmt: skip
        print(f"  {DEVICE} enrolled: token, group key and trusted root in {DEVICE}.json (0600)")
        if self.mqtt:
            self.operator("mqtt", "acl", "--out", "broker")

    def publish(self, version: int) -> None:
        model = MODELS / "digits-light" / "1" / "model.int8.tflite"
        self.operator(
            "models", "publish", "--repository", "ota", "--keys", "keys", "--name",
            "digits-light", "--version", str(version), "--file", str(model), "--group", GROUP,
        )  # fmt: skip

    def start_broker(self) -> None:
        self.broker.start()
        self.stack.callback(self.broker.stop)
        port = self.broker.port
        print(
            f"\n== mosquitto on 127.0.0.1:{port} (devices) and :{self.broker.gateway_port} "
            "(the gateway), with the generated password and ACL files"
        )
        password = (self.work / "gateway-state/mqtt-gateway.password").read_text().strip()
        self.watcher = TelemetryWatcher(self.broker.gateway_port, password)
        self.stack.callback(self.watcher.close)

    def start_gateway(self) -> None:
        print("\n== the cloud gateway")
        print("$ cloud-gateway --config gateway.toml serve", flush=True)
        log = self.work / "gateway.log"
        command = [sys.executable, "-m", "cloud_gateway", "--config", "gateway.toml", "serve"]
        self.processes.start("gateway", command, log, cwd=self.work, env=self.env())
        started = time.monotonic()
        url = f"http://127.0.0.1:{self.gateway_http}/v2/health/ready"
        while True:
            self.check_alive("gateway")
            try:
                with urllib.request.urlopen(url, timeout=1):
                    break
            except OSError:
                if time.monotonic() - started > READY_TIMEOUT_S:
                    raise DemoError("the gateway was not ready in time") from None
                time.sleep(0.1)
        bridge = f", MQTT bridge to :{self.broker.gateway_port}" if self.mqtt else ""
        print(
            f"  ready in {time.monotonic() - started:.1f} s: REST :{self.gateway_http}, "
            f"gRPC :{self.gateway_grpc}, OTA{bridge}; serving digits-heavy and ppocr-det"
        )

    # -- the device ----------------------------------------------------------------------------

    def device_root(self) -> Path:
        """A Raspberry Pi 5 as the agent reads it: device tree, CPUs, cpufreq, a thermal zone."""
        root = self.work / "pi5"
        tree = root / "proc/device-tree"
        tree.mkdir(parents=True)
        (tree / "model").write_bytes(b"Raspberry Pi 5 Model B Rev 1.0\x00")
        (root / "proc/cpuinfo").write_text(CPUINFO)
        for cpu in range(4):
            freq = root / f"sys/devices/system/cpu/cpu{cpu}/cpufreq"
            freq.mkdir(parents=True)
            (freq / "scaling_governor").write_text("ondemand\n")
            (freq / "scaling_available_governors").write_text("ondemand performance powersave\n")
            (freq / "cpuinfo_min_freq").write_text("1500000\n")
            (freq / "cpuinfo_max_freq").write_text("2400000\n")
            (freq / "scaling_max_freq").write_text("2400000\n")
        zone = root / "sys/class/thermal/thermal_zone0"
        zone.mkdir(parents=True)
        (zone / "temp").write_text("52000\n")
        return root

    def agent_config(self) -> list[str]:
        """The agent's configuration: what the demo needs; the rest is the defaults."""
        self.agent_http = free_port()
        interval = 3600 if self.mqtt else 2  # with MQTT the announcement starts the update
        lines: list[tuple[str, str]] = [
            (f'device_id = "{DEVICE}"', ""),
            (f'root = "{self.device_root().name}"', "the simulated Pi 5: its profile is detected"),
            ('state_dir = "agent-state"', "the OTA slots, the telemetry queue"),
            ("[gateway]", "gRPC; the token is the enrollment bundle's"),
            (f'address = "127.0.0.1:{self.gateway_grpc}"', ""),
            ("[breaker]", ""),
            ("failures = 1", "open at the first failure (default 3)"),
            ("[ota]", ""),
            (f'bundle = "{DEVICE}.json"', ""),
            (f'url = "http://127.0.0.1:{self.gateway_http}"', ""),
            (
                f"interval_s = {interval}",
                "the periodic check" + (" (a fallback)" if self.mqtt else ""),
            ),
            ("jitter_s = 0", ""),
        ]
        if self.mqtt:
            lines += [
                ("[mqtt]", "user cam-01, the token as password"),
                (f"port = {self.broker.port}", ""),
                ("[telemetry]", ""),
                ("interval_s = 2", ""),
            ]
        lines += [("[api]", "the local API"), (f"http_port = {self.agent_http}", "")]
        lines += [("grpc_port = 0", "HTTP only"), ("[logging]", ""), ('format = "text"', "")]
        return [f"{text:<36}# {note}" if note else text for text, note in lines]

    def start_agent(self) -> None:
        print(f"\n== the edge agent: {DEVICE}, a simulated Raspberry Pi 5")
        lines = self.agent_config()
        (self.work / "agent.toml").write_text("\n".join(lines) + "\n")
        print("agent.toml:\n" + "\n".join(f"  {line}" for line in lines))
        notify_path = self.work / "notify.sock"
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
            notify.bind(str(notify_path))
            notify.settimeout(0.5)
            print("$ NOTIFY_SOCKET=notify.sock edge-agent run --config agent.toml", flush=True)
            command = [sys.executable, "-m", "edge_agent", "run", "--config", "agent.toml"]
            env = self.env(NOTIFY_SOCKET=str(notify_path))
            self.processes.start("agent", command, self.work / "agent.log", cwd=self.work, env=env)
            started = time.monotonic()
            status = ""
            while True:
                self.check_alive("agent")
                if time.monotonic() - started > READY_TIMEOUT_S:
                    raise DemoError("the agent did not say READY=1 in time")
                try:
                    message = notify.recv(4096).decode(errors="replace")
                except TimeoutError:
                    continue
                fields = dict(line.split("=", 1) for line in message.splitlines() if "=" in line)
                status = fields.get("STATUS", status)
                if fields.get("READY") == "1":
                    break
        print(f"  READY=1 after {time.monotonic() - started:.1f} s ({status})")
        found = re.search(r"profile ([\w.-]+)", (self.work / "agent.log").read_text())
        if found:
            print(f"  profile {found.group(1)}, detected from the fake device tree")
        self.versions["before"] = self.loaded_version("digits-light")

    def check_alive(self, name: str) -> None:
        if not self.processes.alive(name):
            raise DemoError(f"the {name} exited ({self.processes.running[name].returncode})")

    # -- requests ------------------------------------------------------------------------------

    def infer(
        self, what: str, model: str, arrays: dict[str, Array], label: str = "public",
        describe: Describe | None = None, note: str = "",
    ) -> None:  # fmt: skip
        """One request through the agent's local API; the label travels as a header."""
        request = InferRequest(
            inputs=arrays,
            datatypes=dict.fromkeys(arrays, "FP32"),
            parameters={"timeout": REQUEST_TIMEOUT_US},
        )
        body, header_length = encode_infer_request(request)
        headers = {"Content-Type": "application/octet-stream", "X-Edge-Label": label}
        if header_length is not None:
            headers[HEADER_LENGTH] = str(header_length)
        connection = http.client.HTTPConnection("127.0.0.1", self.agent_http, timeout=60)
        try:
            started = time.perf_counter()
            connection.request("POST", f"/v2/models/{model}/infer", body, headers)
            response = connection.getresponse()
            data = response.read()
            latency_ms = (time.perf_counter() - started) * 1000
        finally:
            connection.close()
        step = Step(what, model, label, latency_ms=latency_ms, note=note)
        if response.status == 200:
            length = response.getheader(HEADER_LENGTH)
            answer = decode_infer_response(data, int(length) if length else None)
            p = answer.parameters
            step.action, step.reason = p["edge_action"], p["edge_reason"]
            step.where = p["edge_where"]
            if p["edge_degraded"]:
                step.where += ", degraded"
            step.answered_by = f"{p['edge_model']} v{answer.model_version}"
            step.answer = describe(answer.outputs) if describe else "-"
        else:
            document = json.loads(data)
            decision = document.get("decision")
            if not decision:
                raise DemoError(f"{what}: HTTP {response.status}: {document.get('error')}")
            step.action, step.reason = decision["decision"], decision["reason"]
            step.answer = f"refused: HTTP {response.status}"
        self.steps.append(step)
        print(
            f"  {len(self.steps)}. {what} -> {model}, {label}: {step.action} ({step.reason}), "
            f"{step.where}, {step.answered_by}: {step.answer}; {step.latency_ms:.1f} ms",
            flush=True,
        )

    def requests(self, inputs: Inputs) -> None:
        print("\n== requests to the agent: POST /v2/models/<model>/infer, X-Edge-Label: <label>")
        sure, unsure = {"pixels": inputs.sure}, {"pixels": inputs.unsure}
        sure_digit, unsure_digit = digit(inputs.sure_truth), digit(inputs.unsure_truth)
        self.infer("a digit it is sure of", "digits-light", sure, describe=sure_digit)
        self.infer(
            f"a digit it is unsure of: {inputs.unsure_light}", "digits-light", unsure,
            describe=unsure_digit,
        )  # fmt: skip
        self.infer(
            "the same, sensitive", "digits-light", unsure, "sensitive", unsure_digit,
            note="sensitive data may not leave: the light model's answer stands, unsure as it is",
        )  # fmt: skip
        self.infer(
            "a digit, personal", "digits-heavy", unsure, "personal", unsure_digit,
            note="personal data leaves only redacted (the exit guard checks the copy again)",
        )  # fmt: skip
        self.infer(
            f"a photo with a face ({inputs.photo_name})", "ppocr-det", {"x": inputs.photo},
            describe=text_map,
            note="labelled public, but the agent found a face: personal, so only a copy "
            "with the face pixelated left",
        )  # fmt: skip
        self.infer(
            "a digit, sensitive", "digits-heavy", sure, "sensitive",
            note="a cloud-only model and data that may not leave: refused",
        )  # fmt: skip

    # -- the update over the air ---------------------------------------------------------------

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.agent_http}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return bytes(response.read()).decode()

    def loaded_version(self, model: str) -> int | None:
        pattern = r"^edge_agent_model_loaded\{([^}]*)\} 1\.0$"
        for labels in re.findall(pattern, self.metrics(), re.MULTILINE):
            values = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            if values.get("model") == model:
                return int(values["version"])
        return None

    def update(self, inputs: Inputs) -> None:
        print("\n== an update over the air: digits-light v2 for the group")
        self.publish(NEW_VERSION)
        started = time.monotonic()
        self.operator(
            "rollout", "start", "--name", "digits-light", "--version", str(NEW_VERSION),
            "--group", GROUP, "--percent", "100",
        )  # fmt: skip
        how = "the rollout announcement (MQTT)" if self.mqtt else "the agent's check every 2 s"
        print(f"  waiting for {DEVICE} to install it; {how} starts the update", flush=True)
        while self.loaded_version("digits-light") != NEW_VERSION:
            self.check_alive("agent")
            if time.monotonic() - started > READY_TIMEOUT_S:
                raise DemoError(f"{DEVICE} did not install v{NEW_VERSION} in time")
            time.sleep(0.1)
        seconds = time.monotonic() - started
        self.versions["after"] = NEW_VERSION
        print(
            f"  {DEVICE} serves digits-light v{NEW_VERSION} {seconds:.1f} s after the rollout "
            "started: downloaded, verified, decrypted, smoke-tested, swapped in"
        )
        self.update_note = f"{seconds:.1f} s after `rollout start`, started by {how}"
        self.infer("a digit it is sure of", "digits-light", {"pixels": inputs.sure},
                   describe=digit(inputs.sure_truth))  # fmt: skip
        # the device reports the outcome to the gateway just after the swap
        deadline = time.monotonic() + 15
        while "installed 1" not in self.run_gateway_cli("rollout", "status", echo=False):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.operator("rollout", "status")

    # -- the cloud goes away -------------------------------------------------------------------

    def outage(self, inputs: Inputs) -> None:
        print("\n== the gateway stops")
        code = self.processes.stop("gateway")
        print(f"  cloud-gateway stopped (SIGTERM; exit {code})")
        unsure, describe = {"pixels": inputs.unsure}, digit(inputs.unsure_truth)
        self.infer(
            "a digit for the cloud", "digits-heavy", unsure, describe=describe,
            note="the gateway is down: the offload fails, and digits-light (which escalates "
            "to digits-heavy) stands in",
        )  # fmt: skip
        self.infer(
            "a digit it is unsure of", "digits-light", unsure, describe=describe,
            note="the circuit breaker is open: no escalation is tried, the local answer stands",
        )  # fmt: skip

    # -- the summary ---------------------------------------------------------------------------

    def summary(self, seconds: float, mqtt_off: str, *, kept: bool = False) -> None:
        print("\n== summary")
        headers = ["#", "request", "model", "label", "decision", "reason", "where",
                   "answered by", "answer", "ms"]  # fmt: skip
        rows = [
            [i, s.what, s.model, s.label, s.action, s.reason, s.where, s.answered_by, s.answer,
             f"{s.latency_ms:6.1f}"]
            for i, s in enumerate(self.steps, 1)
        ]  # fmt: skip
        print(render_table(headers, rows))
        print()
        for i, step in enumerate(self.steps, 1):
            if step.note:
                print(f"{i}: {step.note}")
        print()
        before, after = self.versions.get("before"), self.versions.get("after")
        print(f"OTA:  digits-light v{before} before, v{after} after ({self.update_note})")
        if self.watcher is not None:
            kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(self.watcher.kinds.items()))
            print(
                f"MQTT: on (mosquitto :{self.broker.port}); telemetry the operator received: "
                f"{kinds or 'none'}"
            )
        else:
            print(f"MQTT: off ({mqtt_off})")
        folder = "kept (below)" if kept else "removed"
        print(f"time: {seconds:.0f} s; everything stopped and the working folder {folder}")
