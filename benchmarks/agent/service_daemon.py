"""The daemon under benchmark: ``edge-agent run`` as a child process on a fake
device root, told to notify a socket of ours, and the clients that call it (for
:mod:`benchmarks.agent.service`)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import edge_agent
from edge_core.errors import EdgeError
from edge_core.processes import free_port, stop_process
from edge_core.protocol.rest import HEADER_LENGTH, decode_infer_response, encode_infer_request
from edge_core.protocol.types import InferRequest

PROFILE = "raspberry-pi-5"
DEVICE = "bench-device"  # the device gateway_process enrolls
RSS_TARGET_MB = 80.0
READY_TARGET_S = 1.5
# the soak's requests: (model, label, weight); no label is the policy's default (public)
MIX: tuple[tuple[str, str | None, int], ...] = (
    ("digits-light", None, 5),
    ("digits-light", "personal", 1),
    ("digits-light", "sensitive", 1),
    ("digits-heavy", None, 2),
    ("digits-heavy", "personal", 1),
    ("digits-heavy", "sensitive", 1),
)
HEAVY = ("digits-heavy",)
REFUSED = ("403", "PERMISSION_DENIED")  # the policy answering, not a failure
Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class ServiceSettings:
    """How much of each part to do; the defaults are the full run."""

    requests: int = 300  # per path after the warm-up (overhead)
    warmup: int = 50
    starts: int = 5  # per configuration (startup and idle RSS)
    idle_s: float = 3.0  # after READY=1, before reading VmRSS
    soak_s: float = 120.0
    soak_threads: int = 4
    sample_every_s: float = 10.0  # RSS during the soak
    telemetry_interval_s: float = 5.0  # short, so that the soak sends periodic telemetry
    imports: bool = True  # the import probe: two fresh interpreters per configuration


# -- the daemon ---------------------------------------------------------------------------


def fake_root(base: Path, cpus: int = 2) -> Path:
    """cpufreq for ``cpus`` CPUs and one thermal zone at 50 C, and no ``proc/loadavg``
    (the policy offloads from a busy CPU, and this machine is shared)."""
    (base / "proc").mkdir(parents=True)
    (base / "proc/meminfo").write_text("MemTotal:        8000000 kB\n")
    for index in range(cpus):
        freq = base / f"sys/devices/system/cpu/cpu{index}/cpufreq"
        freq.mkdir(parents=True)
        for name, value in (
            ("scaling_governor", "ondemand"),
            ("scaling_available_governors", "ondemand powersave performance"),
            ("cpuinfo_min_freq", "600000"),
            ("cpuinfo_max_freq", "2400000"),
            ("scaling_max_freq", "2400000"),
        ):
            (freq / name).write_text(value + "\n")
    zone = base / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "temp").write_text("50000\n")
    return base


def rss_of(pid: int) -> dict[str, float]:
    """``VmRSS`` of ``pid`` and its anonymous and file-backed parts, in MB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = round(int(value.split()[0]) / 1024.0, 1)
    return out


def child_env() -> dict[str, str]:
    """This environment, minus systemd's, able to import this ``edge_agent`` (a checkout
    run without an install too)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    env.pop("WATCHDOG_PID", None)
    here = str(Path(edge_agent.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    return env


@dataclass
class BenchConfig:
    name: str
    path: Path
    http_port: int
    grpc_port: int
    spec: dict[str, Any]  # what it was written from, to write another on fresh ports


def write_config(
    tmp: Path, name: str, *, root: Path, models: Path, grpc: bool, extra: str = ""
) -> BenchConfig:
    http_port, grpc_port = free_port(), free_port() if grpc else 0
    slug = re.sub(r"\W+", "-", name)
    path = tmp / f"{slug}.toml"
    path.write_text(
        f'device_id = "{DEVICE}"\nprofile = "{PROFILE}"\nroot = "{root}"\n'
        f'model_dir = "{models}"\nstate_dir = "{tmp / "state" / slug}"\n'
        "[privacy]\nface_detector = false\n"
        f"[api]\nhttp_port = {http_port}\ngrpc_port = {grpc_port}\ndrain_s = 2\n"
        f"[thermal]\ninterval_s = 1\n{extra}"
    )
    spec = {"root": root, "models": models, "grpc": grpc, "extra": extra}
    return BenchConfig(name, path, http_port, grpc_port, spec)


class RunningDaemon:
    """``edge-agent run --config`` in a child process; its log goes to a file."""

    def __init__(self, config: BenchConfig, tmp: Path) -> None:
        self.config = config
        self.notify_path = tmp / f"notify-{time.monotonic_ns()}.sock"
        self.log = self.notify_path.with_suffix(".log")
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind(str(self.notify_path))
        self._notify.settimeout(0.1)
        env = {**child_env(), "NOTIFY_SOCKET": str(self.notify_path)}
        command = [sys.executable, "-m", "edge_agent", "run", "--config", str(config.path)]
        with self.log.open("wb") as log:
            self._started = time.perf_counter()
            self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log)

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Seconds from ``Popen`` to ``READY=1`` on the notify socket.

        Raises:
            EdgeError: the daemon exited, or said nothing within ``timeout``.
        """
        while time.perf_counter() < self._started + timeout:
            try:
                data = self._notify.recv(4096)
            except TimeoutError:
                if self.process.poll() is not None:
                    raise EdgeError(f"the daemon exited: {self._log_tail()}") from None
                continue
            if "READY=1" in data.decode(errors="replace").splitlines():
                return time.perf_counter() - self._started
        raise EdgeError(f"no READY=1 within {timeout:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-10:])

    def own_start_s(self) -> float | None:
        """The daemon's own "ready in" (from ``start()`` on): the rest of the time to
        READY=1 is the interpreter and the imports."""
        match = re.search(r"ready in ([0-9.]+) s", self.log.read_text(errors="replace"))
        return float(match.group(1)) if match else None

    def rss(self) -> dict[str, float]:
        return rss_of(self.process.pid)

    def metrics(self) -> str:
        connection = http.client.HTTPConnection("127.0.0.1", self.config.http_port, timeout=10)
        try:
            connection.request("GET", "/metrics")
            return connection.getresponse().read().decode()
        finally:
            connection.close()

    def loaded_variants(self) -> dict[str, str]:
        """``model -> variant`` from ``edge_agent_model_loaded`` in /metrics."""
        out = {}
        for labels in re.findall(r"^edge_agent_model_loaded\{(.*)\} 1\.0$", self.metrics(), re.M):
            values = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            out[values["model"]] = values["variant"]
        return out

    def stop(self) -> None:
        stop_process(self.process, 30)
        self._notify.close()
        self.notify_path.unlink(missing_ok=True)


@contextlib.contextmanager
def running(config: BenchConfig, tmp: Path) -> Iterator[RunningDaemon]:
    daemon = RunningDaemon(config, tmp)
    try:
        daemon.wait_ready()
        yield daemon
    finally:
        daemon.stop()


def metric_sum(text: str, name: str) -> float | None:
    """A metric's value summed over its labels (``None``: not there)."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + " ", name + "{"))
    ]
    return sum(values) if values else None


# -- clients ------------------------------------------------------------------------------


def light_request(x: Array, model: str = "digits-light") -> InferRequest:
    return InferRequest(
        inputs={"pixels": np.ascontiguousarray(x, dtype=np.float32)},
        datatypes={"pixels": "FP32"},
        model_name=model,
    )


class HttpClient:
    """One keep-alive connection; tensors as binary data (the protocol's extension)."""

    def __init__(self, port: int) -> None:
        self._connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def infer(self, request: InferRequest, label: str | None = None) -> tuple[str, Any]:
        """``("200", InferResponse)``, or the status and the error document."""
        body, header_length = encode_infer_request(request)
        headers = {"Content-Type": "application/octet-stream"}
        if header_length is not None:
            headers[HEADER_LENGTH] = str(header_length)
        if label is not None:
            headers["X-Edge-Label"] = label
        try:
            self._connection.request(
                "POST", f"/v2/models/{request.model_name}/infer", body, headers
            )
            response = self._connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            self._connection.close()  # the next request opens a fresh connection
            raise
        if response.status != 200:
            return str(response.status), json.loads(data)
        length = response.getheader(HEADER_LENGTH)
        return "200", decode_infer_response(data, int(length) if length else None)

    def close(self) -> None:
        self._connection.close()


class GrpcClient:
    """A bare ``ModelInfer`` stub on one channel: no tritonclient wrapper in the timing."""

    def __init__(self, port: int) -> None:
        import grpc

        from edge_core.protocol.grpc import pb, request_to_proto, response_from_proto

        self._error = grpc.RpcError
        self._to_proto, self._from_proto = request_to_proto, response_from_proto
        self._channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self._call = self._channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=pb().ModelInferResponse.FromString,
        )

    def infer(self, request: InferRequest, label: str | None = None) -> tuple[str, Any]:
        """``("OK", InferResponse)``, or the status code's name and its details."""
        metadata = [("x-edge-label", label)] if label is not None else []
        try:
            message = self._call(self._to_proto(request), timeout=30, metadata=metadata)
        except self._error as exc:
            return str(exc.code().name), {"error": exc.details()}
        return "OK", self._from_proto(message)

    def close(self) -> None:
        self._channel.close()
