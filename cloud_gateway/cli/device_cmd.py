"""``cloud-gateway device add|revoke|list`` and ``cloud-gateway mqtt acl`` (the broker's
files from the device registry)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from cloud_gateway.cli.common import device_registry, ota_dir_of, state_database, state_dir_of
from cloud_gateway.config import GatewayConfig, MqttBridgeSettings, Overrides, load_config
from edge_core.errors import EdgeError
from edge_core.report import render_table

__all__ = ["register"]


def register(commands: Any) -> None:
    device = commands.add_parser("device", help="manage device tokens")
    device_commands = device.add_subparsers(dest="device_command", metavar="ACTION", required=True)
    add = device_commands.add_parser("add", help="register a device and print its token once")
    add.add_argument("device_id")
    add.add_argument("--group", required=True, help="the device's fleet group")
    role = add.add_mutually_exclusive_group()
    role.add_argument("--admin", action="store_true", help="may manage the repository")
    role.add_argument(
        "--metrics", action="store_true", help="reads /metrics and nothing else (a scraper's)"
    )
    add.add_argument(
        "--replace", action="store_true", help="issue a new token for an existing device"
    )
    add.add_argument("--bundle", type=Path, help="where to write the enrollment bundle")
    add.add_argument(
        "--repository", type=Path, help="the OTA repository (its root goes in the bundle)"
    )
    add.add_argument("--gateway", help="the gateway's URL, recorded in the bundle")
    add.set_defaults(run=_device_add)
    revoke = device_commands.add_parser("revoke", help="revoke a device's token")
    revoke.add_argument("device_id")
    revoke.set_defaults(run=_device_revoke)
    listing = device_commands.add_parser("list", help="list devices")
    listing.set_defaults(run=_device_list)

    mqtt = commands.add_parser("mqtt", help="the fleet's MQTT broker")
    mqtt_commands = mqtt.add_subparsers(dest="mqtt_command", metavar="ACTION", required=True)
    acl = mqtt_commands.add_parser(
        "acl", help="write Mosquitto's password and ACL files from the device registry"
    )
    acl.add_argument("--out", type=Path, required=True, help="directory for passwd and acl")
    acl.add_argument("--gateway-user", help="the bridge's broker user (default: _gateway)")
    acl.add_argument(
        "--broker-group",
        help="the broker's group, which may read the files (0640); default, as root: "
        "mosquitto when that group exists (Debian's broker, started as root, reads them as "
        "it), else none (0600)",
    )
    acl.set_defaults(run=_mqtt_acl)


def _device_add(args: argparse.Namespace) -> int:
    from cloud_gateway.ota.groups import GroupKeys, write_bundle
    from cloud_gateway.ota.publish import OtaRepository

    registry = device_registry(args)
    try:
        token = registry.add(
            args.device_id,
            args.group,
            role="admin" if args.admin else "metrics" if args.metrics else "device",
            replace=args.replace,
        )
    except ValueError as exc:
        raise EdgeError(str(exc)) from None
    print(f"device {args.device_id} (group {args.group}) added to {registry.path}", file=sys.stderr)
    state = state_dir_of(args)
    try:
        private, _ = GroupKeys(state).ensure(args.group)
    except ValueError as exc:
        raise EdgeError(str(exc)) from None
    ota = ota_dir_of(args)
    has_root = ota is not None and (ota / "metadata" / "root.json").is_file()
    root = OtaRepository(ota).root_bytes() if ota is not None and has_root else None
    bundle = args.bundle or state / "bundles" / f"{args.device_id}.json"
    write_bundle(
        bundle,
        device_id=args.device_id,
        group=args.group,
        token=token,
        group_private=private,
        trusted_root=root,
        gateway=args.gateway,
    )
    note = "" if root else " (no OTA repository yet, no trusted root in it: cloud-gateway ota init)"
    print(
        f"enrollment bundle (token, group key, trusted root; mode 0600): {bundle}{note}",
        file=sys.stderr,
    )
    print("its token, shown only this once (the gateway stores a hash):", file=sys.stderr)
    print(token)
    return 0


def _device_revoke(args: argparse.Namespace) -> int:
    try:
        device_registry(args).revoke(args.device_id)
    except KeyError as exc:
        raise EdgeError(str(exc.args[0])) from None
    print(f"device {args.device_id} revoked")
    return 0


def _device_list(args: argparse.Namespace) -> int:
    from cloud_gateway.auth import DeviceRegistry
    from cloud_gateway.ota.rollouts import RolloutStore

    database = state_database(args)
    try:
        store = RolloutStore(database)
        seen, serving = store.last_seen(), store.serving()
        devices = DeviceRegistry(database).devices()
    finally:
        database.close()
    now = time.time()
    rows = []
    for device in devices:
        state = "revoked" if device.revoked else "active"
        models = ", ".join(f"{n} v{v}" for n, v in sorted(serving.get(device.id, {}).items()))
        at, what = seen.get(device.id, (None, ""))
        rows.append(
            [device.id, device.group, device.role, state, models or "-",
             f"{_ago(now - at)} ({what})" if at is not None else "never"]
        )  # fmt: skip
    headers = ["device", "group", "role", "state", "serving", "last seen"]
    print(render_table(headers, rows))
    return 0


def _ago(seconds: float) -> str:
    """How long ago, as a person says it: 12 s, 4 min, 3 h, 2 days ago."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{max(seconds, 0):.0f} s ago"


DEBIAN_BROKER_GROUP = "mosquitto"  # Debian's Mosquitto starts as root, then drops to it


def _mqtt_acl(args: argparse.Namespace) -> int:
    from cloud_gateway.mqtt.broker import broker_group, ensure_gateway_password, write_broker_files

    if args.config is not None:
        config = load_config(args.config, Overrides(repository=Path(".")))
    else:
        config = GatewayConfig(repository=Path("."), state_dir=state_dir_of(args))
    user = args.gateway_user or (config.mqtt.username if config.mqtt else None)
    user = str(user or MqttBridgeSettings().username)
    password = ensure_gateway_password(config.mqtt_password_file)
    # Debian's broker, started as root (a system service), reads its files as mosquitto;
    # a broker run as this user reads them as this user
    name = args.broker_group or (DEBIAN_BROKER_GROUP if os.geteuid() == 0 else "none")
    try:
        group = broker_group(None if name == "none" else name)
    except ValueError:
        if args.broker_group is not None:
            raise EdgeError(f"--broker-group {name}: no such group on this machine") from None
        group = None  # no Debian broker here: only the owner reads them
    try:
        files = write_broker_files(
            device_registry(args),
            args.out,
            gateway_user=user,
            gateway_password=password,
            group=group,
        )
    except ValueError as exc:
        raise EdgeError(str(exc)) from None
    readable = f"mode 0640, readable by group {name}" if group is not None else "mode 0600"
    print(f"written ({readable}; password hashes only) into {args.out}:")
    print(f"the devices' password file ({files.devices} devices): {files.passwd}")
    print(f"the gateways' password file ({user!r}): {files.gateway_passwd}")
    print(f"ACL file: {files.acl}")
    print(f"dynamic security plugin configuration: {files.dynamic_security}")
    print(f"the gateway's own password (mode 0600): {config.mqtt_password_file}")
    if files.skipped:
        print(
            f"left out (no MQTT password yet; `device add --replace` issues one): "
            f"{', '.join(files.skipped)}",
            file=sys.stderr,
        )
    print(
        "point Mosquitto's listener for devices (use_username_as_clientid true) at the "
        "devices' password file and its listener for gateways at theirs, both at the ACL "
        "file (per_listener_settings true; SIGHUP reloads them), or, to refuse foreign "
        "subscriptions when they are made, load the dynamic security plugin with the JSON "
        "file (plugin_opt_config_file; a change takes a restart): docs/mqtt.md"
    )
    return 0
