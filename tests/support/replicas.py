"""Gateway replicas as separate ``cloud-gateway serve`` processes (so that one can be
killed with SIGKILL), HAProxy in front of them from ``deploy/haproxy.cfg`` and the
broker from ``deploy/mosquitto.conf``: the files a deployment uses, run by the tests."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from edge_core.processes import free_port, stop_process

from .paths import ROOT
from .services import need

__all__ = ["Replica", "start_haproxy", "start_mosquitto", "start_replica", "wait_http"]

DEPLOY = ROOT / "deploy"


def wait_http(url: str, timeout: float = 30.0, *, status: int = 200) -> None:
    end = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == status:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        if time.monotonic() > end:
            raise TimeoutError(f"{url} did not answer {status} within {timeout} s")
        time.sleep(0.05)


@dataclass
class Replica:
    name: str
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def kill(self) -> None:
        """kill -9: no clean stop, no goodbye to the broker or the database."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        stop_process(self.process)


def start_replica(
    root: Path, name: str, settings: str, *, address_space: int | None = None
) -> Replica:
    """``cloud-gateway serve`` with ``settings`` (TOML lines: repository, state, ...) and
    its own ports and state directory; ``address_space``: its limit on virtual memory in
    bytes (``prlimit --as``), so that a request taking too much fails in the gateway
    rather than take the machine."""
    folder = root / name
    folder.mkdir(parents=True)
    http_port, grpc_port = free_port(), free_port()
    config = folder / "gateway.toml"
    config.write_text(
        f'state_dir = "{folder / "state"}"\nhttp_port = {http_port}\ngrpc_port = {grpc_port}\n'
        + settings
    )
    log = folder / "gateway.log"
    limit = [] if address_space is None else ["prlimit", f"--as={address_space}", "--"]
    process = subprocess.Popen(
        [*limit, sys.executable, "-m", "cloud_gateway", "--config", str(config), "serve"],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),  # noqa: SIM115 - the child holds it
        cwd=ROOT,
    )
    replica = Replica(name, process, http_port, grpc_port, log)
    try:
        wait_http(f"http://{replica.http_url}/v2/health/ready", 60)
    except TimeoutError:
        replica.kill()
        raise RuntimeError(f"replica {name} did not start: {log.read_text()[-2000:]}") from None
    return replica


def start_haproxy(root: Path, a: Replica, b: Replica) -> tuple[subprocess.Popen[bytes], int, int]:
    """HAProxy on ``deploy/haproxy.cfg`` in front of ``a`` and ``b``; its process and its
    REST and gRPC ports, once both replicas are in."""
    need("haproxy")
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    http_port, grpc_port = free_port(), free_port()
    environment = {
        **os.environ,
        "LISTEN_HTTP": f"127.0.0.1:{http_port}",
        "LISTEN_GRPC": f"127.0.0.1:{grpc_port}",
        "GATEWAY_A": "127.0.0.1",
        "GATEWAY_B": "127.0.0.1",
        "HTTP_PORT_A": str(a.http_port),
        "HTTP_PORT_B": str(b.http_port),
        "GRPC_PORT_A": str(a.grpc_port),
        "GRPC_PORT_B": str(b.grpc_port),
    }
    log = open(root / "haproxy.log", "wb")  # noqa: SIM115 - the child holds it
    process = subprocess.Popen(
        [binary, "-db", "-f", str(DEPLOY / "haproxy.cfg")],
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    wait_http(f"http://127.0.0.1:{http_port}/v2/health/ready", 20)
    return process, http_port, grpc_port


def start_mosquitto(root: Path, files: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    """Mosquitto on ``deploy/mosquitto.conf``, with free ports and the files of ``mqtt
    acl --out files`` put in for the deployment's paths; its process and the ports of
    its listeners for devices and for gateways."""
    need("broker")
    port, gateway_port = free_port(), free_port()
    while gateway_port == port:
        gateway_port = free_port()
    data = root / "mosquitto-data"
    data.mkdir()
    put_in = {
        "listener 1883": f"listener {port} 127.0.0.1",
        "listener 1884": f"listener {gateway_port} 127.0.0.1",
        "password_file /mosquitto/config/passwd": f"password_file {files / 'passwd'}",
        "password_file /mosquitto/config/gateway-passwd":
            f"password_file {files / 'gateway-passwd'}",
        "acl_file /mosquitto/config/acl": f"acl_file {files / 'acl'}",
        "persistence_location /mosquitto/data/": f"persistence_location {data}/",
        "log_dest stdout": f"log_dest file {root / 'mosquitto.log'}",
    }  # fmt: skip
    lines = []
    for line in (DEPLOY / "mosquitto.conf").read_text().splitlines():
        lines.append(put_in.get(line, line))
    missing = set(put_in) - set((DEPLOY / "mosquitto.conf").read_text().splitlines())
    assert not missing, f"deploy/mosquitto.conf no longer has {sorted(missing)}"
    if os.geteuid() == 0:
        lines.append("user root")  # the test's files are root's
    config = root / "mosquitto.conf"
    config.write_text("\n".join(lines) + "\n")
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    process = subprocess.Popen([binary, "-c", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)  # fmt: skip
    end = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process, port, gateway_port
        except OSError:
            if process.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"mosquitto did not start from {config}") from None
            time.sleep(0.02)
