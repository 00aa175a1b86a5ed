"""Staged rollouts: which devices get which model version, and their reports.

A rollout deploys ``name`` ``version`` to ``percent`` of a group. A device is
in the slice when a stable hash of its id and the model's name falls below
the percent, so raising the percent keeps the devices already in. Devices
report what they installed (or failed to, or went back from); a rollout
counts only the reports of devices in its own slice of its own group, and
when the failed share of those reaches its threshold, it pauses itself.

The plan a device is given (:meth:`RolloutStore.plan`):

- the highest version of each model among the group's live rollouts whose
  slice holds the device: *active* ones, and *paused* ones the device has
  installed already;
- never a version the device reported ``failed`` or ``rolled_back`` since
  that rollout was last started (``rollout start``): a bad version is not
  downloaded again at every check, and an operator's rollback on the device
  sticks until the rollout is started again or a newer version comes;
- for *aborted* rollouts above that, the aborted version, marked withdrawn,
  to the devices that reported it installed (:meth:`RolloutStore.withdrawn`):
  a device that runs it goes back, once the signed metadata withdraws it too
  (``cloud-gateway models withdraw``); the plan alone never moves a device back.

State lives in SQLite (``<state>/rollouts.sqlite``) and survives restarts;
the gateway and the command line share it, so every change of state is one
conditional statement (an aborted rollout is never moved to another state by
a concurrent pause or resume).
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

# Reports that count against a rollout: the version itself failed on the device (no key,
# withdrawn, unloadable, its smoke test). A refusal does not: metadata or a download that
# failed to verify (tampered, replayed, expired, corrupted in transit) says nothing of
# the model, blocks nothing for the device (it tries again at its next check), and
# whoever can corrupt bytes on one device's path must not pause the fleet's rollout.
# Refusals are counted and shown (`rollout status`), for the operator to see.
FAILURES = ("failed",)

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
        self._db = sqlite3.connect(
            str(self.path), check_same_thread=False, isolation_level=None, timeout=30.0
        )
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
            CREATE TABLE IF NOT EXISTS seen (
                device TEXT PRIMARY KEY, at REAL NOT NULL, what TEXT NOT NULL DEFAULT ''
            );
            CREATE TABLE IF NOT EXISTS serving (
                device TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL,
                at REAL NOT NULL, PRIMARY KEY (device, name)
            );
            """
        )
        # columns added since the first release (an existing database gains them)
        self._add_column("rollouts", "started", "REAL NOT NULL DEFAULT 0")
        self._add_column("reports", "grp", "TEXT NOT NULL DEFAULT ''")

    def _add_column(self, table: str, column: str, declaration: str) -> None:
        columns = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
        if column not in columns:
            try:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
            except sqlite3.OperationalError as exc:  # another process added it meanwhile
                if "duplicate column" not in str(exc):
                    raise

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
        """Start a rollout, or change the percent of an existing one (and make it active).

        Starting it again offers it again to devices that failed it or went
        back from it.
        """
        if not 0 < percent <= 100:
            raise ValueError(f"percent must be in (0, 100], got {percent}")
        if not 0 < failure_threshold <= 1:
            raise ValueError(f"failure threshold must be in (0, 1], got {failure_threshold}")
        now = self._clock()
        with self._lock:
            self._db.execute(
                "INSERT INTO rollouts (name, version, grp, percent, state, failure_threshold, "
                "reason, created, updated, started) VALUES (?, ?, ?, ?, 'active', ?, '', ?, ?, ?) "
                "ON CONFLICT (name, version, grp) DO UPDATE SET percent=excluded.percent, "
                "state='active', failure_threshold=excluded.failure_threshold, reason='', "
                "updated=excluded.updated, started=excluded.started",
                (name, version, group, percent, failure_threshold, now, now, now),
            )
        rollout = self.get(name, version, group)
        assert rollout is not None
        return rollout

    def set_state(
        self, name: str, version: int | None, group: str | None, state: str, reason: str = ""
    ) -> list[Rollout]:
        """Pause, resume (``active``) or abort rollouts of ``name`` (optionally one version/group).

        Aborted rollouts stay aborted (``rollout start`` starts one again):
        the change is one conditional ``UPDATE``, in one transaction with
        reading which rollouts it changed.

        Raises:
            KeyError: no such rollout that is not aborted.
        """
        if state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}")
        now = self._clock()
        where = (
            "name=? AND (? IS NULL OR version=?) AND (? IS NULL OR grp=?) AND state != 'aborted'"
        )
        args = (name, version, version, group, group)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                keys = self._db.execute(
                    f"SELECT version, grp FROM rollouts WHERE {where}", args
                ).fetchall()
                self._db.execute(
                    f"UPDATE rollouts SET state=?, reason=?, updated=? WHERE {where}",
                    (state, reason, now, *args),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        if not keys:
            raise KeyError(
                f"no rollout of {name}"
                + (f" v{version}" if version is not None else "")
                + (f" for {group}" if group is not None else "")
                + " that is not aborted"
            )
        changed = [self.get(name, v, g) for v, g in keys]
        return [r for r in changed if r is not None]

    def seen(self, device: str, what: str, at: float | None = None) -> None:
        """The device was heard from (``what``: an update check, a request) now or ``at``."""
        when = self._clock() if at is None else at
        with self._lock:
            self._db.execute(
                "INSERT INTO seen (device, at, what) VALUES (?, ?, ?) ON CONFLICT (device) "
                "DO UPDATE SET at=excluded.at, what=excluded.what WHERE excluded.at > seen.at",
                (device, when, what),
            )

    def last_seen(self) -> dict[str, tuple[float, str]]:
        """When each device was last heard from, and how."""
        with self._lock:
            rows = self._db.execute("SELECT device, at, what FROM seen").fetchall()
        return {device: (at, what) for device, at, what in rows}

    def serving(self) -> dict[str, dict[str, int]]:
        """What each device says it serves now, by model (from its reports)."""
        with self._lock:
            rows = self._db.execute("SELECT device, name, version FROM serving").fetchall()
        out: dict[str, dict[str, int]] = {}
        for device, name, version in rows:
            out.setdefault(device, {})[name] = version
        return out

    def reports(self, name: str, version: int, group: str) -> list[dict[str, Any]]:
        """The reports of one rollout's devices, the newest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT device, status, detail, at FROM reports "
                "WHERE name=? AND version=? AND grp=? ORDER BY at DESC",
                (name, version, group),
            ).fetchall()
        return [{"device": d, "status": s, "detail": t, "at": a} for d, s, t, a in rows]

    def report(
        self,
        device: str,
        group: str,
        name: str,
        version: int,
        status: str,
        detail: str = "",
        *,
        serving: int | None = None,
    ) -> Rollout | None:
        """Record a device's report (``serving``: the version it serves after it); pause
        the rollout when failures reach its threshold.

        Only the reports of devices in the rollout's slice of its group count.
        Returns the rollout if this report paused it.
        """
        with self._lock:
            if serving is not None:
                self._db.execute(
                    "INSERT INTO serving (device, name, version, at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (device, name) DO UPDATE SET version=excluded.version, "
                    "at=excluded.at",
                    (device, name, serving, self._clock()),
                )
            # a refusal of the metadata says nothing of a version the device installed
            self._db.execute(
                "INSERT INTO reports (device, name, version, status, detail, at, grp) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (device, name, version) "
                "DO UPDATE SET status=excluded.status, detail=excluded.detail, at=excluded.at, "
                "grp=excluded.grp "
                "WHERE NOT (excluded.status = 'refused' AND reports.status = 'installed')",
                (device, name, version, status, detail[:500], self._clock(), group),
            )
        rollout = self.get(name, version, group)
        if rollout is None or rollout.state != "active" or status not in FAILURES:
            return None
        if not in_slice(device, name, rollout.percent):
            return None  # not sent this version by this rollout: not its evidence
        stats = self.stats(name, version, group)
        failed = sum(stats[status] for status in FAILURES)
        if failed / max(stats["reported"], 1) < rollout.failure_threshold:
            return None
        reason = (
            f"paused itself: {failed} of {stats['reported']} reporting devices failed "
            f"(threshold {rollout.failure_threshold:.0%}); the last, {device}: {detail[:200]}"
        )
        with self._lock:
            paused = self._db.execute(
                "UPDATE rollouts SET state='paused', reason=?, updated=? "
                "WHERE name=? AND version=? AND grp=? AND state='active'",
                (reason, self._clock(), name, version, group),
            ).rowcount
        return self.get(name, version, group) if paused else None

    def stats(self, name: str, version: int, group: str) -> dict[str, int]:
        """Report counts of the rollout of ``name`` ``version`` to ``group``, from its slice."""
        rollout = self.get(name, version, group)
        percent = rollout.percent if rollout is not None else 0.0
        with self._lock:
            rows = self._db.execute(
                "SELECT device, status FROM reports WHERE name=? AND version=? AND grp=?",
                (name, version, group),
            ).fetchall()
        statuses = [status for device, status in rows if in_slice(device, name, percent)]
        return {
            "installed": statuses.count("installed"),
            "failed": statuses.count("failed"),
            "rolled_back": statuses.count("rolled_back"),
            "refused": statuses.count("refused"),
            "reported": len(statuses),
        }

    def device_status(self, device: str, name: str, version: int) -> str | None:
        report = self.device_report(device, name, version)
        return report[0] if report else None

    def device_report(self, device: str, name: str, version: int) -> tuple[str, str] | None:
        """The status and detail of the device's last report on ``name`` ``version``."""
        with self._lock:
            row = self._db.execute(
                "SELECT status, detail FROM reports WHERE device=? AND name=? AND version=?",
                (device, name, version),
            ).fetchone()
        return (str(row[0]), str(row[1])) if row else None

    def _blocked(self, device: str, group: str) -> set[tuple[str, int]]:
        """(name, version) pairs the device left or failed since their rollout last started."""
        with self._lock:
            rows = self._db.execute(
                "SELECT r.name, r.version FROM reports r JOIN rollouts o "
                "ON o.name = r.name AND o.version = r.version AND o.grp = ? "
                "WHERE r.device = ? AND r.status IN ('failed', 'rolled_back') "
                "AND r.at >= o.started",
                (group, device),
            ).fetchall()
        return {(name, version) for name, version in rows}

    def plan(self, device: str, group: str) -> dict[str, int]:
        """Model name -> the version this device should run (absent: no rollout for it)."""
        blocked = self._blocked(device, group)
        chosen: dict[str, int] = {}
        for rollout in self._rows(self._SELECT + " WHERE grp=? AND state != 'aborted'", group):
            if not in_slice(device, rollout.name, rollout.percent):
                continue
            if (rollout.name, rollout.version) in blocked:
                continue
            if (
                rollout.state == "paused"
                and self.device_status(device, rollout.name, rollout.version) != "installed"
            ):
                continue
            if rollout.version > chosen.get(rollout.name, 0):
                chosen[rollout.name] = rollout.version
        return chosen

    def withdrawn(self, device: str, group: str) -> list[tuple[str, int]]:
        """Aborted versions above what :meth:`plan` gives, that this device reported installed.

        Only those: an agent older than the ``withdrawn`` mark would take
        such an entry for a version to install.
        """
        chosen = self.plan(device, group)
        found = set()
        for rollout in self._rows(self._SELECT + " WHERE grp=? AND state = 'aborted'", group):
            if rollout.version <= chosen.get(rollout.name, 0):
                continue
            if self.device_status(device, rollout.name, rollout.version) == "installed":
                found.add((rollout.name, rollout.version))
        return sorted(found)
