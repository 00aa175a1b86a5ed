"""The broker's access control, written from the device registry, in two forms.

With either, a device (username: its id, password: its token) can publish
only its own telemetry and status and offload requests, and read only its own
responses and its group's announcements; the gateway's bridge user reads the
requests and writes the responses and announcements. Revoked devices and metrics
tokens are left out. Publishing where a device may not is refused (PUBACK 0x87).

- ``passwd`` and ``acl``, Mosquitto's password and ACL files: rewriting them
  and sending Mosquitto ``SIGHUP`` applies a change (a revocation) at once. But
  Mosquitto (2.0) checks an ACL file's ``read`` access when it delivers a
  message, not when a client subscribes: a device may subscribe to another's
  topics (it is granted) and is sent nothing from them.
- ``dynamic-security.json``, for Mosquitto's dynamic security plugin (one role
  per device): subscriptions are checked when they are made, so a device that
  subscribes to another's topics is refused (SUBACK 0x87). The plugin reads
  the file when Mosquitto starts (the file has no admin client for
  ``mosquitto_ctl``): a change, a revocation too, takes a restart.

Client ids: Mosquitto disconnects a client when another connects with its client
id, and neither its ACL nor its password file looks at the id, so each form binds
a device's id to its user name. The dynamic security plugin's client of a device
requires the device's own id (:func:`~edge_core.protocol.mqtt.client_id`): any
other is refused (CONNACK 0x87). With the files, the devices' listener takes
``use_username_as_clientid`` (whatever id a device asks for, it gets its user
name) and ``passwd`` holds only the devices; the gateway replicas, which share one
user and need one id each, sign in on a listener of their own with
``gateway-passwd`` (docs/mqtt.md). The plugin's gateway client has no fixed id.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloud_gateway.auth import Device, DeviceRegistry, mosquitto_hash, write_private
from edge_core.protocol.mqtt import (
    REQUEST_FILTER,
    announcement_topic,
    client_id,
    response_topic,
    status_topic,
    stream_results_topic,
    telemetry_topic,
)

__all__ = [
    "BrokerFiles",
    "acl_text",
    "broker_group",
    "broker_users",
    "dynamic_security",
    "ensure_gateway_password",
    "shared_requests",
    "shared_telemetry",
    "write_broker_files",
]

DYNAMIC_SECURITY = "dynamic-security.json"
GATEWAY_PASSWD = "gateway-passwd"


@dataclass(frozen=True)
class BrokerFiles:
    passwd: Path  # the devices' (their listener's password file)
    gateway_passwd: Path  # the gateway's user only (the gateways' listener's)
    acl: Path
    dynamic_security: Path
    devices: int
    skipped: list[str]  # devices without an MQTT password hash (added before there was one)


def shared_requests(password: str) -> str:
    """The gateways' shared subscription: every replica with the same broker
    password shares one group, whose name no device can guess."""
    group = hashlib.sha256(b"edge-inference shared requests\x00" + password.encode()).hexdigest()
    return f"$share/gateways-{group[:24]}/{REQUEST_FILTER}"


def shared_telemetry(password: str) -> str:
    """The gateways' shared subscription to the devices' telemetry: each message reaches
    one replica, which writes it to the state database they share."""
    return shared_requests(password).replace(REQUEST_FILTER, telemetry_topic("+", "#"))


def ensure_gateway_password(path: Path) -> str:
    """The gateway's broker password, generated (mode 0600) the first time."""
    if path.is_file():
        return path.read_text().strip()
    password = secrets.token_urlsafe(32)
    write_private(path, (password + "\n").encode())
    return password


def broker_users(registry: DeviceRegistry) -> list[Device]:
    """The registry's entries that sign in to the broker: neither revoked nor a metrics
    token (a scraper's, which reads the gateway's /metrics and nothing else)."""
    return [d for d in registry.devices() if not d.revoked and d.role != "metrics"]


def acl_text(registry: DeviceRegistry, gateway_user: str) -> str:
    lines = [
        f"# written by `cloud-gateway mqtt acl` from {registry.path}; rewrite, do not edit",
        "",
        "# every device: its own topics",
        "pattern write devices/%u/telemetry/#",
        "pattern write devices/%u/status",
        f"pattern write {stream_results_topic('%u', '+')}",
        "pattern read devices/%u/responses",
        "",
        "# the gateway's bridge",
        f"user {gateway_user}",
        f"topic read {REQUEST_FILTER}",
        "topic write devices/+/responses",
        f"topic readwrite {announcement_topic('+')}",
        "topic read devices/+/telemetry/#",
        "topic read devices/+/status",
        f"topic read {stream_results_topic('+', '+')}",
    ]
    for device in broker_users(registry):
        lines += [
            "",
            f"user {device.id}",
            f"topic read {announcement_topic(device.group)}",
            f"topic write {REQUEST_FILTER}",  # any model: the gateway checks the token
        ]
    return "\n".join(lines) + "\n"


def _rule(kind: str, topic: str) -> dict[str, Any]:
    return {"acltype": kind, "topic": topic, "priority": 0, "allow": True}


def _client(
    user: str, password_hash: str, role: str, clientid: str | None = None
) -> dict[str, Any]:
    """A dynamic-security client from a ``$7$`` hash (the same PBKDF2-SHA512); with
    ``clientid``, it may connect with that client id only."""
    _, kind, iterations, salt, digest = password_hash.split("$")
    if kind != "7":
        raise ValueError(f"{user}: not a $7$ (PBKDF2-SHA512) password hash")
    client: dict[str, Any] = {
        "username": user,
        "password": digest,
        "salt": salt,
        "iterations": int(iterations),
        "roles": [{"rolename": role}],
    }
    if clientid is not None:
        client["clientid"] = clientid
    return client


def dynamic_security(
    registry: DeviceRegistry, gateway_user: str, gateway_password: str, hashes: dict[str, str]
) -> dict[str, Any]:
    """The dynamic security plugin's configuration: one role per device, denying by
    default every publish and subscription the roles do not allow, and each device
    bound to its own client id (the gateway's client is not: each replica has its
    own). ``hashes``: the users' ``$7$`` password hashes, the gateway's included."""
    gateway_role = {
        "rolename": "gateway",
        "acls": [
            _rule("subscribeLiteral", shared_requests(gateway_password)),
            _rule("subscribeLiteral", shared_telemetry(gateway_password)),
            _rule("subscribePattern", telemetry_topic("+", "#")),
            _rule("subscribePattern", status_topic("+")),
            _rule("subscribePattern", stream_results_topic("+", "+")),
            _rule("subscribePattern", announcement_topic("+")),
            _rule("publishClientSend", response_topic("+")),
            _rule("publishClientSend", announcement_topic("+")),
        ],
    }
    clients = [_client(gateway_user, hashes[gateway_user], "gateway")]
    roles = [gateway_role]
    for device in broker_users(registry):
        if device.id not in hashes:
            continue
        role = f"device-{device.id}"
        clients.append(_client(device.id, hashes[device.id], role, client_id(device.id)))
        roles.append(
            {
                "rolename": role,
                "acls": [
                    _rule("publishClientSend", telemetry_topic(device.id, "#")),
                    _rule("publishClientSend", status_topic(device.id)),
                    _rule("publishClientSend", stream_results_topic(device.id, "+")),
                    _rule("publishClientSend", REQUEST_FILTER),  # the gateway checks the token
                    _rule("subscribeLiteral", response_topic(device.id)),
                    _rule("subscribeLiteral", announcement_topic(device.group)),
                ],
            }
        )
    return {
        "defaultACLAccess": {
            "publishClientSend": False,
            "publishClientReceive": True,
            "subscribe": False,
            "unsubscribe": True,
        },
        "clients": clients,
        "groups": [],
        "roles": roles,
    }


def broker_group(name: str | None) -> int | None:
    """The gid of the broker's group ``name`` (``None``: none).

    Raises:
        ValueError: there is no such group on this machine.
    """
    if name is None:
        return None
    import grp

    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ValueError(f"no group {name!r} on this machine (the broker's own)") from None


def write_broker_files(
    registry: DeviceRegistry,
    out: Path,
    *,
    gateway_user: str,
    gateway_password: str,
    group: int | None = None,
) -> BrokerFiles:
    """Write ``passwd`` (the devices), ``gateway-passwd`` (the gateway's user), ``acl``
    and ``dynamic-security.json`` into ``out``: mode 0600, or 0640 with ``group`` (the
    broker's group: Debian's Mosquitto starts as root and drops to the ``mosquitto``
    account before it reads them). They hold password hashes, never a password."""
    if registry.get(gateway_user) is not None:
        raise ValueError(f"a device is named {gateway_user!r}, the gateway's broker user")
    hashes = {gateway_user: mosquitto_hash(gateway_password)}
    skipped = []
    for device in broker_users(registry):
        password = registry.mqtt_password(device.id)
        if password is None:
            skipped.append(device.id)
            continue
        hashes[device.id] = password
    passwd, gateway_passwd = out / "passwd", out / GATEWAY_PASSWD
    acl, dynsec = out / "acl", out / DYNAMIC_SECURITY
    devices = "".join(
        f"{user}:{hashed}\n" for user, hashed in hashes.items() if user != gateway_user
    )
    write_private(passwd, devices.encode(), group=group)
    write_private(gateway_passwd, f"{gateway_user}:{hashes[gateway_user]}\n".encode(), group=group)
    write_private(acl, acl_text(registry, gateway_user).encode(), group=group)
    document = dynamic_security(registry, gateway_user, gateway_password, hashes)
    write_private(dynsec, (json.dumps(document, indent=1) + "\n").encode(), group=group)
    return BrokerFiles(passwd, gateway_passwd, acl, dynsec, len(hashes) - 1, skipped)
