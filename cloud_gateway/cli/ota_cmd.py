"""``cloud-gateway keys init|rotate``, ``models publish|withdraw`` and ``ota init|refresh``:
the signed, encrypted update repository."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cloud_gateway.cli.common import state_dir_of
from edge_core.errors import EdgeError

__all__ = ["register"]


def register(commands: Any) -> None:
    _register_keys(commands)
    _register_models(commands)
    _register_ota(commands)


def _register_keys(commands: Any) -> None:
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


def _register_models(commands: Any) -> None:
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


def _register_ota(commands: Any) -> None:
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
    keys = GroupKeys(state_dir_of(args))
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
