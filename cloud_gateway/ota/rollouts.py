"""Staged rollouts: which devices get which model version, and their reports.

A rollout deploys ``name`` ``version`` to ``percent`` of a group. A device is
in the slice when a stable hash of its id and the model's name falls below
the percent, so raising the percent keeps the devices already in. Devices
report what they installed (or failed to); when the failed share of a
rollout's reports reaches its threshold, the rollout pauses itself. Paused:
no device that has not installed the version starts it; aborted: the version
is withdrawn (devices go back to the previous one).

State lives in SQLite (``<state>/rollouts.sqlite``) and survives restarts.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Rollout", "RolloutStore", "in_slice"]

STATES = ("active", "paused", "aborted")


def in_slice(device_id: str, name: str, percent: float) -> bool:
    """Whether ``device_id`` is among the first ``percent`` % of devices for ``name``."""
    bucket = int(hashlib.sha256(f"{name}\x00{device_id}".encode()).hexdigest()[:8], 16) % 10000
    return bucket < percent * 100


@dataclass(frozen=True)
class Rollout:
    name: str
    version: int
    group: str
    percent: float
    state: str
    failure_threshold: float
    reason: str
    created: float
    updated: float

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class RolloutStore:
    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(
            """
            CREATE TABLE IF NOT EXISTS rollouts (
                name TEXT NOT NULL, version INTEGER NOT NULL, grp TEXT NOT NULL,
                percent REAL NOT NULL, state TEXT NOT NULL, failure_threshold REAL NOT NULL,
                reason TEXT NOT NULL DEFAULT '', created REAL NOT NULL, updated REAL NOT NULL,
                PRIMARY KEY (name, version, grp)
            );
            CREATE TABLE IF NOT EXISTS reports (
                device TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL,
                status TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '', at REAL NOT NULL,
                PRIMARY KEY (device, name, version)
            );
            """
        )

    def close(self) -> None:
        self._db.close()

    _SELECT = (
        "SELECT name, version, grp, percent, state, failure_threshold, reason, created, updated "
        "FROM rollouts"
    )

    def _rows(self, query: str, *args: Any) -> list[Rollout]:
        with self._lock:
            rows = self._db.execute(query, args).fetchall()
        return [Rollout(*row) for row in rows]

    def get(self, name: str, version: int, group: str) -> Rollout | None:
        rows = self._rows(
            self._SELECT + " WHERE name=? AND version=? AND grp=?",
            name, version, group,
        )  # fmt: skip
        return rows[0] if rows else None

    def all(self, name: str | None = None) -> list[Rollout]:
        query = self._SELECT
        if name is not None:
            return self._rows(query + " WHERE name=? ORDER BY version, grp", name)
        return self._rows(query + " ORDER BY name, version, grp")

    def start(
        self, name: str, version: int, group: str, percent: float, *, failure_threshold: float = 0.2
    ) -> Rollout:
        """Start a rollout, or change the percent of an existing one (and make it active)."""
        if not 0 < percent <= 100:
            raise ValueError(f"percent must be in (0, 100], got {percent}")
        if not 0 < failure_threshold <= 1:
            raise ValueError(f"failure threshold must be in (0, 1], got {failure_threshold}")
        now = self._clock()
        with self._lock:
            self._db.execute(
                "INSERT INTO rollouts VALUES (?, ?, ?, ?, 'active', ?, '', ?, ?) "
                "ON CONFLICT (name, version, grp) DO UPDATE SET percent=excluded.percent, "
                "state='active', failure_threshold=excluded.failure_threshold, reason='', "
                "updated=excluded.updated",
                (name, version, group, percent, failure_threshold, now, now),
            )
        rollout = self.get(name, version, group)
        assert rollout is not None
        return rollout

    def set_state(
        self, name: str, version: int | None, group: str | None, state: str, reason: str = ""
    ) -> list[Rollout]:
        """Pause, resume (``active``) or abort rollouts of ``name`` (optionally one version/group).

        Raises:
            KeyError: no such rollout.
        """
        if state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}")
        matching = [
            r for r in self.all(name)
            if (version is None or r.version == version) and (group is None or r.group == group)
            and r.state != "aborted"
        ]  # fmt: skip
        if not matching:
            raise KeyError(f"no rollout of {name}" + (f" v{version}" if version else ""))
        with self._lock:
            for r in matching:
                self._db.execute(
                    "UPDATE rollouts SET state=?, reason=?, updated=? "
                    "WHERE name=? AND version=? AND grp=?",
                    (state, reason, self._clock(), r.name, r.version, r.group),
                )
        return [self.get(r.name, r.version, r.group) for r in matching]  # type: ignore[misc]

    def report(
        self, device: str, group: str, name: str, version: int, status: str, detail: str = ""
    ) -> Rollout | None:
        """Record a device's report; pause the rollout when failures reach its threshold.

        Returns the rollout if this report paused it.
        """
        with self._lock:
            self._db.execute(
                "INSERT INTO reports VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (device, name, version) "
                "DO UPDATE SET status=excluded.status, detail=excluded.detail, at=excluded.at",
                (device, name, version, status, detail[:500], self._clock()),
            )
        rollout = self.get(name, version, group)
        if rollout is None or rollout.state != "active" or status != "failed":
            return None
        stats = self.stats(name, version)
        if stats["failed"] / max(stats["reported"], 1) >= rollout.failure_threshold:
            reason = (
                f"paused itself: {stats['failed']} of {stats['reported']} reporting devices failed "
                f"(threshold {rollout.failure_threshold:.0%})"
            )
            return self.set_state(name, version, group, "paused", reason)[0]
        return None

    def stats(self, name: str, version: int) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute(
                "SELECT status, COUNT(*) FROM reports WHERE name=? AND version=? GROUP BY status",
                (name, version),
            ).fetchall()
        counts = dict(rows)
        return {
            "installed": counts.get("installed", 0),
            "failed": counts.get("failed", 0),
            "reported": sum(counts.values()),
        }

    def device_status(self, device: str, name: str, version: int) -> str | None:
        with self._lock:
            row = self._db.execute(
                "SELECT status FROM reports WHERE device=? AND name=? AND version=?",
                (device, name, version),
            ).fetchone()
        return row[0] if row else None

    def plan(self, device: str, group: str) -> dict[str, int]:
        """Model name -> the version this device should run (absent: no rollout for it)."""
        chosen: dict[str, int] = {}
        for rollout in self._rows(
            self._SELECT + " WHERE grp=? AND state != 'aborted'",
            group,
        ):
            if not in_slice(device, rollout.name, rollout.percent):
                continue
            if (
                rollout.state == "paused"
                and self.device_status(device, rollout.name, rollout.version) != "installed"
            ):
                continue
            if rollout.version > chosen.get(rollout.name, 0):
                chosen[rollout.name] = rollout.version
        return chosen
