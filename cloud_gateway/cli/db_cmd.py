"""``cloud-gateway db upgrade``: the state database's schema, brought up to date."""

from __future__ import annotations

import argparse
from typing import Any

from cloud_gateway.cli.common import settings_of
from cloud_gateway.state import StateDatabase, describe, upgrade

__all__ = ["register"]


def register(commands: Any) -> None:
    db = commands.add_parser("db", help="the state database")
    db_commands = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    up = db_commands.add_parser(
        "upgrade",
        help="apply the schema's migrations (and import devices.json and rollouts.sqlite "
        "from the state directory, once)",
    )
    up.set_defaults(run=_upgrade)


def _upgrade(args: argparse.Namespace) -> int:
    config = settings_of(args)
    database = StateDatabase(config.state_url)
    try:
        revision = upgrade(database, legacy_dir=config.state_dir)
    finally:
        database.close()
    print(f"{describe(config.state_url)}: schema at revision {revision}")
    return 0
