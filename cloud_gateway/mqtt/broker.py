"""The broker's password and ACL files, written from the device registry.

With them a device (username: its id, password: its token) can publish only
its own telemetry and status and offload requests, and read only its own
responses and its group's announcements; the gateway's bridge user reads the
requests and writes the responses and announcements. Revoked devices are left
out, so rewriting the files (and sending Mosquitto ``SIGHUP``) locks them out.

Mosquitto (2.0) checks ``read`` access when it delivers a message, not when a
client subscribes: a device may subscribe to another's topics, and is sent
nothing from them. Publishing where it may not is refused (PUBACK 0x87).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from cloud_gateway.auth import DeviceRegistry, mosquitto_hash, write_private
from edge_agent.protocol.mqtt import REQUEST_FILTER, announcement_topic

__all__ = ["BrokerFiles", "acl_text", "ensure_gateway_password", "write_broker_files"]


@dataclass(frozen=True)
class BrokerFiles:
    passwd: Path
    acl: Path
    devices: int
    skipped: list[str]  # devices without an MQTT password hash (added before there was one)


def ensure_gateway_password(path: Path) -> str:
    """The gateway's broker password, generated (mode 0600) the first time."""
    if path.is_file():
        return path.read_text().strip()
    password = secrets.token_urlsafe(32)
    write_private(path, (password + "\n").encode())
    return password


def acl_text(registry: DeviceRegistry, gateway_user: str) -> str:
    lines = [
        f"# written by `cloud-gateway mqtt acl` from {registry.path}; rewrite, do not edit",
        "",
        "# every device: its own topics",
        "pattern write devices/%u/telemetry/#",
        "pattern write devices/%u/status",
        "pattern read devices/%u/responses",
        "",
        "# the gateway's bridge",
        f"user {gateway_user}",
        f"topic read {REQUEST_FILTER}",
        "topic write devices/+/responses",
        f"topic readwrite {announcement_topic('+')}",
        "topic read devices/+/telemetry/#",
        "topic read devices/+/status",
    ]
    for device in registry.devices():
        if device.revoked:
            continue
        lines += [
            "",
            f"user {device.id}",
            f"topic read {announcement_topic(device.group)}",
            f"topic write {REQUEST_FILTER}",  # any model: the gateway checks the token
        ]
    return "\n".join(lines) + "\n"


def write_broker_files(
    registry: DeviceRegistry, out: Path, *, gateway_user: str, gateway_password: str
) -> BrokerFiles:
    """Write ``passwd`` and ``acl`` (mode 0600) into ``out``."""
    if registry.get(gateway_user) is not None:
        raise ValueError(f"a device is named {gateway_user!r}, the gateway's broker user")
    entries = [f"{gateway_user}:{mosquitto_hash(gateway_password)}"]
    skipped = []
    for device in registry.devices():
        password = registry.mqtt_password(device.id)
        if device.revoked:
            continue
        if password is None:
            skipped.append(device.id)
            continue
        entries.append(f"{device.id}:{password}")
    passwd, acl = out / "passwd", out / "acl"
    write_private(passwd, ("\n".join(entries) + "\n").encode())
    write_private(acl, acl_text(registry, gateway_user).encode())
    return BrokerFiles(passwd, acl, len(entries) - 1, skipped)
