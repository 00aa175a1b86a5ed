"""A Mosquitto of its own on loopback, for the benchmarks and the demo that need a
broker: free ports, a generated configuration (the password and ACL files of
``cloud-gateway mqtt acl``, or its dynamic security plugin's configuration),
persistence on disk. Needs the ``mosquitto`` binary (``make broker`` installs
it)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from edge_core.errors import EdgeError
from edge_core.processes import free_port, stop_process

__all__ = ["Mosquitto"]


def _binary() -> str:
    for candidate in (shutil.which("mosquitto"), "/usr/sbin/mosquitto"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise EdgeError("mosquitto is not installed (`make broker`, or apt-get install mosquitto)")


def dynamic_security_plugin() -> Path:
    """Mosquitto's dynamic security plugin, as its packages install it."""
    for folder in ("usr/lib/*", "usr/lib", "usr/local/lib"):
        for candidate in sorted(Path("/").glob(f"{folder}/mosquitto_dynamic_security.so")):
            return candidate
    raise EdgeError(
        "Mosquitto's dynamic security plugin (mosquitto_dynamic_security.so) is missing"
    )


class Mosquitto:
    """``passwd``, ``gateway_passwd`` and ``acl``: Mosquitto's password and ACL files,
    laid out as docs/mqtt.md sets them up: the devices sign in on :attr:`port`, which
    gives each one its user name as client id (no device can take another's), the
    gateways on :attr:`gateway_port` (one id per replica). Or ``dynamic_security``: the
    dynamic security plugin's configuration file, one listener for all."""

    def __init__(
        self,
        directory: Path,
        *,
        passwd: Path | None = None,
        gateway_passwd: Path | None = None,
        acl: Path | None = None,
        dynamic_security: Path | None = None,
    ) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.gateway_port = self.port
        self.log = directory / "mosquitto.log"
        self.config = directory / "mosquitto.conf"
        lines = [
            "persistence true",
            f"persistence_location {directory}/",
            "max_queued_messages 100000",  # for offline persistent sessions
            "set_tcp_nodelay true",  # else each small answer waits ~40 ms (Nagle, delayed ACK)
            f"log_dest file {self.log}",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",  # "Reloading config.": reload() waits for it
        ]
        if os.geteuid() == 0:
            lines.append("user root")  # keep root: the files are the caller's
        if passwd is not None:
            if gateway_passwd is None:
                raise ValueError("a broker with the devices' password file needs the gateway's")
            while self.gateway_port == self.port:
                self.gateway_port = free_port()
            acl_line = [f"acl_file {acl}"] if acl is not None else []
            lines += [
                "per_listener_settings true",
                f"listener {self.port} 127.0.0.1",
                "allow_anonymous false",
                "use_username_as_clientid true",
                f"password_file {passwd}",
                *acl_line,
                f"listener {self.gateway_port} 127.0.0.1",
                "allow_anonymous false",
                f"password_file {gateway_passwd}",
                *acl_line,
            ]
        else:
            lines += [
                f"listener {self.port} 127.0.0.1",
                f"allow_anonymous {'false' if dynamic_security else 'true'}",
            ]
        if dynamic_security is not None:
            lines.append(f"plugin {dynamic_security_plugin()}")
            lines.append(f"plugin_opt_config_file {dynamic_security}")
        self.config.write_text("\n".join(lines) + "\n")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        assert self.process is None, "already running"
        self.process = subprocess.Popen(
            [_binary(), "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.process.poll() is not None:
                stderr = self.process.stderr.read().decode() if self.process.stderr else ""
                self.process = None
                raise EdgeError(f"mosquitto exited: {stderr or self.log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise EdgeError(f"mosquitto did not listen on port {self.port} within {timeout} s")

    def stop(self) -> None:
        """A clean stop (SIGTERM): the broker saves its store, as a service restart does."""
        if self.process is None:
            return
        stop_process(self.process)
        self.process = None

    def __enter__(self) -> Mosquitto:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
