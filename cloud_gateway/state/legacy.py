"""The state of a gateway from before the database, imported once.

Until the state database, a gateway kept its devices in
``<state_dir>/devices.json`` and its rollouts, reports, and what it heard from
devices in ``<state_dir>/rollouts.sqlite``. When the state database is opened
with that directory, each file found there is copied in (rows already in the
database win: a device added since is kept) and renamed ``*.migrated``, so it
is imported once and a reader sees where it went.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from cloud_gateway.state import schema
from edge_core.errors import ConfigError

if TYPE_CHECKING:
    from cloud_gateway.state.database import StateDatabase

__all__ = ["import_legacy"]

log = logging.getLogger(__name__)

_COLUMNS = {
    "rollouts": ("name", "version", "grp", "percent", "state", "failure_threshold", "reason",
                 "created", "updated", "started"),
    "reports": ("device", "name", "version", "status", "detail", "at", "grp"),
    "seen": ("device", "at", "what"),
    "serving": ("device", "name", "version", "at"),
}  # fmt: skip


def _insert_new(database: StateDatabase, table: sa.Table, rows: list[dict[str, Any]]) -> int:
    """Insert the rows whose key is not there yet; how many were."""
    if not rows:
        return 0
    keys = [c.name for c in table.primary_key.columns]
    with database.begin() as connection:
        have = {tuple(r) for r in connection.execute(sa.select(*[table.c[k] for k in keys]))}
        fresh = [r for r in rows if tuple(r[k] for k in keys) not in have]
        if fresh:
            connection.execute(table.insert(), fresh)
            if table is schema.devices:
                connection.execute(schema.serial.update().values(value=schema.serial.c.value + 1))
    return len(fresh)


def _devices(path: Path) -> list[dict[str, Any]]:
    try:
        document = json.loads(path.read_text())
        return [
            {
                "id": device_id,
                "grp": str(entry["group"]),
                "role": str(entry.get("role", "device")),
                "revoked": bool(entry.get("revoked", False)),
                "created": str(entry.get("created", "")),
                "token_sha256": str(entry["token_sha256"]),
                "mqtt_password": entry.get("mqtt_password"),
            }
            for device_id, entry in document.get("devices", {}).items()
        ]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"the old device registry is unreadable: {exc}", path=path) from exc


def _rollout_rows(path: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    try:
        old = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            for table, columns in _COLUMNS.items():
                present = {row[1] for row in old.execute(f"PRAGMA table_info({table})")}
                if not present:
                    continue
                # columns added by later releases default as those releases made them
                wanted = [c for c in columns if c in present]
                rows = old.execute(f"SELECT {', '.join(wanted)} FROM {table}").fetchall()
                out[table] = [dict(zip(wanted, row, strict=True)) for row in rows]
        finally:
            old.close()
    except sqlite3.Error as exc:
        raise ConfigError(f"the old rollouts database is unreadable: {exc}", path=path) from exc
    return out


def import_legacy(database: StateDatabase, state_dir: Path) -> None:
    """Import ``devices.json`` and ``rollouts.sqlite`` from ``state_dir`` when there.

    Raises:
        ConfigError: a file is there but unreadable (left in place).
    """
    devices = state_dir / "devices.json"
    if devices.is_file():
        count = _insert_new(database, schema.devices, _devices(devices))
        devices.rename(devices.with_name("devices.json.migrated"))
        log.info("imported %d device(s) from %s into the state database", count, devices)
    rollouts = state_dir / "rollouts.sqlite"
    if rollouts.is_file():
        counts = []
        for table, rows in _rollout_rows(rollouts).items():
            counts.append(f"{_insert_new(database, getattr(schema, table), rows)} {table}")
        for suffix in ("", "-wal", "-shm"):
            old = rollouts.with_name(rollouts.name + suffix)
            if old.exists():
                old.rename(old.with_name(old.name + ".migrated"))
        log.info("imported %s from %s into the state database", ", ".join(counts), rollouts)
