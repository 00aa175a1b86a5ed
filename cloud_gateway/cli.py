"""The ``cloud-gateway`` command line.

    cloud-gateway serve --repository DIR [--host H] [--http-port P] [--grpc-port P] [--config FILE]
    cloud-gateway device add DEVICE_ID --group GROUP [--admin] [--replace] [--bundle FILE]
    cloud-gateway device revoke DEVICE_ID
    cloud-gateway device list
    cloud-gateway keys init --dir DIR [--force --repository OTA_DIR]
    cloud-gateway keys rotate --dir DIR --role ROLE --repository OTA_DIR
    cloud-gateway models publish --repository OTA_DIR --keys DIR --name N --version V --file MODEL
                                 [--group G ...] [--profile P ...]
    cloud-gateway models withdraw --repository OTA_DIR --keys DIR --name N --version V
    cloud-gateway ota init --repository OTA_DIR --keys DIR
    cloud-gateway ota refresh --repository OTA_DIR --keys DIR   (daily, from a timer)
    cloud-gateway rollout start --name N --version V --group G --percent P
    cloud-gateway rollout status [--name N]
    cloud-gateway rollout pause|resume|abort --name N [--version V] [--group G]
    cloud-gateway mqtt acl --out DIR [--gateway-user NAME]
    cloud-gateway bench [--json FILE] [--chart FILE]

Errors exit 1 with one line on stderr (``--debug`` adds the traceback).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cloud_gateway.auth import DeviceRegistry
from cloud_gateway.config import GatewayConfig, MqttBridgeSettings, Overrides, load_config
from edge_core.cli import run_command
from edge_core.errors import EdgeError

__all__ = ["main"]

PROG = "cloud-gateway"
log = logging.getLogger(PROG)


def _config(args: argparse.Namespace) -> GatewayConfig:
    return load_config(
        args.config,
        Overrides(
            repository=getattr(args, "repository", None),
            state_dir=args.state_dir,
            host=getattr(args, "host", None),
            http_port=getattr(args, "http_port", None),
            grpc_port=getattr(args, "grpc_port", None),
        ),
    )


def _registry(args: argparse.Namespace) -> DeviceRegistry:
    if args.config is not None:
        return DeviceRegistry(
            load_config(args.config, Overrides(repository=Path("."))).devices_file
        )
    return DeviceRegistry(
        (args.state_dir or GatewayConfig(repository=Path(".")).state_dir) / "devices.json"
    )


def _serve(args: argparse.Namespace) -> int:
    from cloud_gateway.server import Gateway

    gateway = Gateway(_config(args))
    asyncio.run(gateway.serve_forever())
    return 0


def _state_dir(args: argparse.Namespace) -> Path:
    if args.config is not None:
        return load_config(args.config, Overrides(repository=Path("."))).state_dir
    return Path(args.state_dir or GatewayConfig(repository=Path(".")).state_dir)


def _ota_dir(args: argparse.Namespace) -> Path | None:
    if getattr(args, "repository", None) is not None:
        return Path(args.repository)
    if args.config is not None:
        return load_config(args.config, Overrides(repository=Path("."))).ota_repository
    return None


def _device_add(args: argparse.Namespace) -> int:
    from cloud_gateway.ota.groups import GroupKeys, write_bundle
    from cloud_gateway.ota.publish import OtaRepository

    registry = _registry(args)
    try:
        token = registry.add(
            args.device_id,
            args.group,
            role="admin" if args.admin else "device",
            replace=args.replace,
        )
    except ValueError as exc:
        raise EdgeError(str(exc)) from None
    print(f"device {args.device_id} (group {args.group}) added to {registry.path}", file=sys.stderr)
    state = _state_dir(args)
    try:
        private, _ = GroupKeys(state).ensure(args.group)
    except ValueError as exc:
        raise EdgeError(str(exc)) from None
    ota = _ota_dir(args)
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


def _keys_init(args: argparse.Namespace) -> int:
    from cloud_gateway.ota.keys import KeyStore

    KeyStore(args.dir).init(force=args.force, repository=args.repository)
    print(f"signing keys for root, targets, snapshot and timestamp in {args.dir} (private 0600)")
    return 0


def _keys_rotate(args: argparse.Namespace) -> int:
    from cloud_gateway.ota.keys import KeyStore
    from cloud_gateway.ota.publish import OtaRepository

    version = OtaRepository(args.repository, KeyStore(args.dir)).rotate(args.role)
    print(f"new {args.role} key; root metadata version {version} names it")
    return 0


def _publish(args: argparse.Namespace) -> int:
    from cloud_gateway.ota.groups import GroupKeys
    from cloud_gateway.ota.keys import KeyStore
    from cloud_gateway.ota.publish import OtaRepository

    repository = OtaRepository(args.repository, KeyStore(args.keys))
    if not repository.initialized():
        repository.init()
        print(f"initialised the OTA repository in {args.repository}", file=sys.stderr)
    keys = GroupKeys(_state_dir(args))
    try:
        groups = {group: keys.public(group) for group in args.group}
    except KeyError as exc:
        raise EdgeError(str(exc.args[0])) from None
    except ValueError as exc:
        raise EdgeError(str(exc)) from None
    result = repository.publish(
        name=args.name,
        version=args.version,
        model_file=args.file,
        groups=groups,
        profiles=args.profile or [],
    )
    print(
        f"published {result.name} v{result.version}: {result.length} bytes "
        f"(sha256 {result.sha256[:16]}...) for {', '.join(result.groups)}; "
        f"targets metadata v{result.targets_version}"
    )
    return 0


def _withdraw(args: argparse.Namespace) -> int:
    from cloud_gateway.ota.keys import KeyStore
    from cloud_gateway.ota.publish import OtaRepository

    version = OtaRepository(args.repository, KeyStore(args.keys)).withdraw(args.name, args.version)
    print(
        f"withdrew {args.name} v{args.version}: targets metadata v{version} marks it withdrawn; "
        "devices no longer install it, and those running it go back to their previous version"
    )
    return 0


def _ota_init(args: argparse.Namespace) -> int:
    from cloud_gateway.ota.keys import KeyStore
    from cloud_gateway.ota.publish import OtaRepository

    OtaRepository(args.repository, KeyStore(args.keys)).init()
    print(
        f"an empty signed OTA repository in {args.repository} (root, targets, snapshot, "
        "timestamp); `device add --repository` now puts its root in enrollment bundles"
    )
    return 0


def _ota_refresh(args: argparse.Namespace) -> int:
    from cloud_gateway.ota.keys import KeyStore
    from cloud_gateway.ota.publish import ROOT_NOTICE_DAYS, OtaRepository

    result = OtaRepository(args.repository, KeyStore(args.keys)).refresh()
    print(f"signed new {', '.join(result.signed)} metadata")
    for role, expires in result.expires.items():
        print(f"  {role:<9} expires {expires.isoformat()}")
    if result.root_due:
        print(
            f"the root metadata expires within {ROOT_NOTICE_DAYS} days "
            f"({result.expires['root'].isoformat()}); a refresh never signs it: renew it by hand "
            f"with the root key (cloud-gateway keys rotate --role root --dir KEYS "
            f"--repository {args.repository})",
            file=sys.stderr,
        )
    return 0


def _mqtt_acl(args: argparse.Namespace) -> int:
    from cloud_gateway.mqtt.broker import ensure_gateway_password, write_broker_files

    if args.config is not None:
        config = load_config(args.config, Overrides(repository=Path(".")))
    else:
        config = GatewayConfig(repository=Path("."), state_dir=_state_dir(args))
    user = args.gateway_user or (config.mqtt.username if config.mqtt else None)
    user = str(user or MqttBridgeSettings().username)
    password = ensure_gateway_password(config.mqtt_password_file)
    try:
        files = write_broker_files(
            _registry(args), args.out, gateway_user=user, gateway_password=password
        )
    except ValueError as exc:
        raise EdgeError(str(exc)) from None
    print(f"password file for {files.devices} devices and {user!r}: {files.passwd}")
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
        "point Mosquitto at the password and ACL files (password_file, acl_file; SIGHUP "
        "reloads them), or, to refuse foreign subscriptions when they are made, load the "
        "dynamic security plugin with the JSON file (plugin_opt_config_file; a change "
        "takes a restart)"
    )
    return 0


def _rollouts(args: argparse.Namespace) -> Any:
    from cloud_gateway.ota.rollouts import RolloutStore

    return RolloutStore(_state_dir(args) / "rollouts.sqlite")


def _rollout_start(args: argparse.Namespace) -> int:
    store = _rollouts(args)
    try:
        rollout = store.start(
            args.name,
            args.version,
            args.group,
            args.percent,
            failure_threshold=args.failure_threshold,
        )
    except ValueError as exc:
        raise EdgeError(str(exc)) from None
    print(
        f"rollout of {rollout.name} v{rollout.version} to {rollout.percent:g}% of "
        f"{rollout.group}: {rollout.state}"
    )
    return 0


def _rollout_status(args: argparse.Namespace) -> int:
    store = _rollouts(args)
    rollouts = store.all(args.name)
    if not rollouts:
        print("no rollouts")
    for r in rollouts:
        stats = store.stats(r.name, r.version, r.group)
        reason = f"  ({r.reason})" if r.reason else ""
        print(
            f"{r.name:20} v{r.version:<4} {r.group:16} {r.percent:5g}%  {r.state:8} "
            f"installed {stats['installed']}, failed {stats['failed']}, "
            f"rolled back {stats['rolled_back']}, metadata refused {stats['refused']}{reason}"
        )
    return 0


def _rollout_state(state: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            changed = _rollouts(args).set_state(
                args.name, args.version, args.group, state, f"set to {state} by an operator"
            )
        except KeyError as exc:
            raise EdgeError(str(exc.args[0])) from None
        for r in changed:
            print(f"rollout of {r.name} v{r.version} to {r.group}: {r.state}")
        if state == "aborted":
            versions = sorted({r.version for r in changed})
            print(
                "note: devices that installed "
                + ", ".join(f"v{v}" for v in versions)
                + " keep running it until it is withdrawn in the signed metadata: "
                + "; ".join(
                    f"cloud-gateway models withdraw --repository OTA_DIR --keys DIR "
                    f"--name {args.name} --version {v}"
                    for v in versions
                ),
                file=sys.stderr,
            )
        return 0

    return run


def _device_revoke(args: argparse.Namespace) -> int:
    try:
        _registry(args).revoke(args.device_id)
    except KeyError as exc:
        raise EdgeError(str(exc.args[0])) from None
    print(f"device {args.device_id} revoked")
    return 0


def _device_list(args: argparse.Namespace) -> int:
    for device in _registry(args).devices():
        state = "revoked" if device.revoked else "active"
        print(f"{device.id:24} {device.group:20} {device.role:7} {state:8} {device.created}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from cloud_gateway.bench import run_from_args

    return run_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="The cloud gateway: Open Inference Protocol over REST, gRPC and MQTT.",
    )
    parser.add_argument("--debug", action="store_true", help="verbose logs and tracebacks")
    parser.add_argument("--config", type=Path, help="gateway configuration file (TOML)")
    parser.add_argument(
        "--state-dir", type=Path, help="where devices.json lives (default: gateway-state)"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser("serve", help="serve a model repository")
    serve.add_argument("--repository", type=Path, help="model repository directory")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--http-port", type=int, help="REST port (default 8000)")
    serve.add_argument("--grpc-port", type=int, help="gRPC port (default 8001)")
    serve.set_defaults(run=_serve)

    device = commands.add_parser("device", help="manage device tokens")
    device_commands = device.add_subparsers(dest="device_command", metavar="ACTION", required=True)
    add = device_commands.add_parser("add", help="register a device and print its token once")
    add.add_argument("device_id")
    add.add_argument("--group", required=True, help="the device's fleet group")
    add.add_argument("--admin", action="store_true", help="may manage the repository")
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

    keys = commands.add_parser("keys", help="the update metadata's signing keys")
    key_commands = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    keys_init = key_commands.add_parser("init", help="create Ed25519 keys for the four roles")
    keys_init.add_argument("--dir", type=Path, required=True)
    keys_init.add_argument(
        "--force",
        action="store_true",
        help="replace existing keys (kept in retired-*/), only for a repository without metadata",
    )
    keys_init.add_argument(
        "--repository", type=Path, help="with --force: the OTA repository the keys are for"
    )
    keys_init.set_defaults(run=_keys_init)
    rotate = key_commands.add_parser("rotate", help="replace a role's key (a new root names it)")
    rotate.add_argument("--dir", type=Path, required=True)
    rotate.add_argument(
        "--role", required=True, choices=["root", "targets", "snapshot", "timestamp"]
    )
    rotate.add_argument("--repository", type=Path, required=True, help="the OTA repository")
    rotate.set_defaults(run=_keys_rotate)

    models = commands.add_parser("models", help="publish models over the air")
    model_commands = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    publish = model_commands.add_parser("publish", help="encrypt, sign and publish a model version")
    publish.add_argument("--repository", type=Path, required=True, help="the OTA repository")
    publish.add_argument("--keys", type=Path, required=True, help="the signing keys")
    publish.add_argument("--name", required=True)
    publish.add_argument("--version", type=int, required=True)
    publish.add_argument(
        "--file", type=Path, required=True, help="a variant file in a model package"
    )
    publish.add_argument(
        "--group", action="append", required=True, help="a target group (repeatable)"
    )
    publish.add_argument("--profile", action="append", help="a target device profile (repeatable)")
    publish.set_defaults(run=_publish)
    withdraw = model_commands.add_parser(
        "withdraw", help="mark a published version withdrawn in new signed metadata"
    )
    withdraw.add_argument("--repository", type=Path, required=True, help="the OTA repository")
    withdraw.add_argument("--keys", type=Path, required=True, help="the signing keys")
    withdraw.add_argument("--name", required=True)
    withdraw.add_argument("--version", type=int, required=True)
    withdraw.set_defaults(run=_withdraw)

    ota = commands.add_parser("ota", help="the OTA repository")
    ota_commands = ota.add_subparsers(dest="ota_command", metavar="ACTION", required=True)
    ota_init = ota_commands.add_parser(
        "init", help="create an empty signed repository (before `device add --repository`)"
    )
    ota_init.add_argument("--repository", type=Path, required=True)
    ota_init.add_argument("--keys", type=Path, required=True, help="the signing keys")
    ota_init.set_defaults(run=_ota_init)
    refresh = ota_commands.add_parser(
        "refresh",
        help="sign a new timestamp, and snapshot and targets when they near expiry (run daily)",
    )
    refresh.add_argument("--repository", type=Path, required=True)
    refresh.add_argument("--keys", type=Path, required=True)
    refresh.set_defaults(run=_ota_refresh)

    rollout = commands.add_parser("rollout", help="staged rollouts of published models")
    rollout_commands = rollout.add_subparsers(
        dest="rollout_command", metavar="ACTION", required=True
    )
    start = rollout_commands.add_parser("start", help="deploy a version to a share of a group")
    start.add_argument("--name", required=True)
    start.add_argument("--version", type=int, required=True)
    start.add_argument("--group", required=True)
    start.add_argument("--percent", type=float, required=True)
    start.add_argument(
        "--failure-threshold", type=float, default=0.2, help="failed share that pauses it"
    )
    start.set_defaults(run=_rollout_start)
    status = rollout_commands.add_parser("status", help="rollouts and their reports")
    status.add_argument("--name")
    status.set_defaults(run=_rollout_status)
    for action, state in (("pause", "paused"), ("resume", "active"), ("abort", "aborted")):
        command = rollout_commands.add_parser(action, help=f"{action} rollouts of a model")
        command.add_argument("--name", required=True)
        command.add_argument("--version", type=int)
        command.add_argument("--group")
        command.set_defaults(run=_rollout_state(state))

    mqtt = commands.add_parser("mqtt", help="the fleet's MQTT broker")
    mqtt_commands = mqtt.add_subparsers(dest="mqtt_command", metavar="ACTION", required=True)
    acl = mqtt_commands.add_parser(
        "acl", help="write Mosquitto's password and ACL files from the device registry"
    )
    acl.add_argument("--out", type=Path, required=True, help="directory for passwd and acl")
    acl.add_argument("--gateway-user", help="the bridge's broker user (default: _gateway)")
    acl.set_defaults(run=_mqtt_acl)

    bench = commands.add_parser("bench", help="throughput and latency under concurrent load")
    bench.add_argument("--model", default="digits-heavy")
    bench.add_argument(
        "--repository", type=Path, help="model repository (default: the sample models)"
    )
    bench.add_argument("--variant", default="onnx-int8", help="variant the gateway serves")
    bench.add_argument("--concurrency", default="1,8,32,64", help="client counts")
    bench.add_argument("--seconds", type=float, default=3.0, help="seconds per case")
    bench.add_argument(
        "--threads", type=int, help="runtime threads per inference (default: the inference cores)"
    )
    bench.add_argument(
        "--inference-cpus",
        default="auto",
        help="cores for inference, e.g. 1 or 2,3; the front ends and clients get the others "
        "(auto: the upper half of the cores; none: every thread on every core)",
    )
    bench.add_argument(
        "--client",
        choices=["raw", "tritonclient"],
        default="raw",
        help="raw: pre-encoded requests, answers checked (like perf_analyzer); "
        "tritonclient: the stock aio clients",
    )
    bench.add_argument("--workers", type=int, default=1, help="inference threads of the gateway")
    bench.add_argument("--spinning", action="store_true", help="let ONNX Runtime's threads spin")
    bench.add_argument("--max-batch", type=int, default=64, help="max_batch_size with batching on")
    bench.add_argument(
        "--delay-us", type=int, default=0, help="max_queue_delay_us with batching on"
    )
    bench.add_argument("--json", type=Path, help="write the results here")
    bench.add_argument(
        "--chart", type=Path, help="draw throughput and p99 against concurrency (PNG)"
    )
    bench.set_defaults(run=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format=f"{PROG}: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    # an address in use or a file it cannot read is an error of the operator's too
    return run_command(args, prog=PROG, expected=(EdgeError, OSError))
