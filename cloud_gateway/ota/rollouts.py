"""Staged rollouts: which devices get which model version, and their reports.

(Over 400 lines: the plan, the reports it reads and the conditional statements that
change both share one set of rules about replicas; they stay together.)

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

State lives in the state database (:mod:`cloud_gateway.state`: SQLite, or a
PostgreSQL that replicas share) and survives restarts; every replica and the
command line share it, so every change of state is one conditional statement
(an aborted rollout is never moved to another state by a concurrent pause or
resume on another replica, and a report is one upsert keyed by device, model
and version: sent twice, through two replicas, it is counted once).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from cloud_gateway.state.database import StateDatabase

# Reports that count against a rollout: the version itself failed on the device (no key,
# withdrawn, unloadable, its smoke test). A refusal does not: metadata or a download that
# failed to verify (tampered, replayed, expired, corrupted in transit) says nothing of
# the model, blocks nothing for the device (it tries again at its next check), and
# whoever can corrupt bytes on one device's path must not pause the fleet's rollout.
# Refusals are counted and shown (`rollout status`), for the operator to see.
FAILURES = ("failed",)

__all__ = ["KEPT_VERSIONS", "Rollout", "RolloutStore", "decide", "in_slice"]

STATES = ("active", "paused", "aborted")
# A device's reports kept per model: its newest versions' (the plan reads the statuses of
# versions the group's rollouts offer, which are the newest ones).
KEPT_VERSIONS = 10


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
    def __init__(self, database: StateDatabase, *, clock: Callable[[], float] = time.time) -> None:
        self.database = database
        self._clock = clock

    def _all(self, query: str, **args: Any) -> list[Any]:
        with self.database.begin() as connection:
            return list(connection.execute(sa.text(query), args))

    def _run(self, query: str, **args: Any) -> int:
        """One statement in its own transaction; the rows it changed."""
        with self.database.begin() as connection:
            return int(connection.execute(sa.text(query), args).rowcount)

    def close(self) -> None:
        """Nothing of its own to close: the database is its owner's."""

    _SELECT = (
        "SELECT name, version, grp, percent, state, failure_threshold, reason, created, updated "
        "FROM rollouts"
    )

    def _rows(self, query: str, **args: Any) -> list[Rollout]:
        return [Rollout(*row) for row in self._all(query, **args)]

    def get(self, name: str, version: int, group: str) -> Rollout | None:
        rows = self._rows(
            self._SELECT + " WHERE name=:name AND version=:version AND grp=:grp",
            name=name, version=version, grp=group,
        )  # fmt: skip
        return rows[0] if rows else None

    def all(self, name: str | None = None) -> list[Rollout]:
        query = self._SELECT
        if name is not None:
            return self._rows(query + " WHERE name=:name ORDER BY version, grp", name=name)
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
        self._run(
            "INSERT INTO rollouts (name, version, grp, percent, state, failure_threshold, "
            "reason, created, updated, started) VALUES (:name, :version, :grp, :percent, "
            "'active', :threshold, '', :now, :now, :now) "
            "ON CONFLICT (name, version, grp) DO UPDATE SET percent=excluded.percent, "
            "state='active', failure_threshold=excluded.failure_threshold, reason='', "
            "updated=excluded.updated, started=excluded.started",
            name=name, version=version, grp=group, percent=percent,
            threshold=failure_threshold, now=now,
        )  # fmt: skip
        rollout = self.get(name, version, group)
        assert rollout is not None
        return rollout

    def set_state(
        self, name: str, version: int | None, group: str | None, state: str, reason: str = ""
    ) -> list[Rollout]:
        """Pause, resume (``active``) or abort rollouts of ``name`` (optionally one version/group).

        Aborted rollouts stay aborted (``rollout start`` starts one again):
        the change is one conditional ``UPDATE ... RETURNING``, which says
        which rollouts it changed.

        Raises:
            KeyError: no such rollout that is not aborted.
        """
        if state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}")
        where = (
            "name=:name AND (:version IS NULL OR version=:version) "
            "AND (:grp IS NULL OR grp=:grp) AND state != 'aborted'"
        )
        with self.database.begin() as connection:
            keys = [
                (row[0], row[1])
                for row in connection.execute(
                    sa.text(
                        f"UPDATE rollouts SET state=:state, reason=:reason, updated=:now "
                        f"WHERE {where} RETURNING version, grp"
                    ).bindparams(
                        sa.bindparam("version", type_=sa.Integer),
                        sa.bindparam("grp", type_=sa.String),
                    ),
                    {"name": name, "version": version, "grp": group, "state": state,
                     "reason": reason, "now": self._clock()},
                )
            ]  # fmt: skip
        if not keys:
            raise KeyError(
                f"no rollout of {name}"
                + (f" v{version}" if version is not None else "")
                + (f" for {group}" if group is not None else "")
                + " that is not aborted"
            )
        changed = [self.get(name, v, g) for v, g in keys]
        return [r for r in changed if r is not None]

    def raise_percent(self, name: str, version: int, group: str, percent: float) -> Rollout:
        """Raise a rollout's percent, keeping its state (a paused one stays paused) and the
        devices already in its slice; one conditional ``UPDATE ... RETURNING``.

        Raises:
            ValueError: ``percent`` not above the rollout's, or over 100.
            KeyError: no such rollout that is not aborted.
        """
        if not 0 < percent <= 100:
            raise ValueError(f"percent must be in (0, 100], got {percent}")
        with self.database.begin() as connection:
            changed = connection.execute(
                sa.text(
                    "UPDATE rollouts SET percent=:percent, updated=:now WHERE name=:name "
                    "AND version=:version AND grp=:grp AND state != 'aborted' "
                    "AND percent < :percent RETURNING name"
                ),
                {"percent": percent, "now": self._clock(), "name": name, "version": version,
                 "grp": group},
            ).first()  # fmt: skip
        rollout = self.get(name, version, group)
        if rollout is None or rollout.state == "aborted":
            raise KeyError(f"no rollout of {name} v{version} for {group} that is not aborted")
        if changed is None:
            raise ValueError(
                f"the rollout is at {rollout.percent:g}% already: raise it above that "
                f"(got {percent:g}%)"
            )
        return rollout

    def seen(self, device: str, what: str, at: float | None = None) -> None:
        """The device was heard from (``what``: an update check, a request) now or ``at``."""
        self.seen_many({device: self._clock() if at is None else at}, what)

    def seen_many(self, heard: dict[str, float], what: str) -> None:
        """Devices heard from, and when: one statement for them all."""
        if not heard:
            return
        with self.database.begin() as connection:
            connection.execute(
                sa.text(
                    "INSERT INTO seen (device, at, what) VALUES (:device, :at, :what) "
                    "ON CONFLICT (device) DO UPDATE SET at=excluded.at, what=excluded.what "
                    "WHERE excluded.at > seen.at"
                ),
                [{"device": d, "at": at, "what": what} for d, at in heard.items()],
            )

    def last_seen(self) -> dict[str, tuple[float, str]]:
        """When each device was last heard from, and how."""
        rows = self._all("SELECT device, at, what FROM seen")
        return {device: (at, what) for device, at, what in rows}

    def serving(self) -> dict[str, dict[str, int]]:
        """What each device says it serves now, by model (from its reports)."""
        rows = self._all("SELECT device, name, version FROM serving")
        out: dict[str, dict[str, int]] = {}
        for device, name, version in rows:
            out.setdefault(device, {})[name] = version
        return out

    def reports(self, name: str, version: int, group: str) -> list[dict[str, Any]]:
        """The reports of one rollout's devices, the newest first."""
        rows = self._all(
            "SELECT device, status, detail, at FROM reports "
            "WHERE name=:name AND version=:version AND grp=:grp ORDER BY at DESC",
            name=name, version=version, grp=group,
        )  # fmt: skip
        return [{"device": d, "status": s, "detail": t, "at": a} for d, s, t, a in rows]

    def prune_reports(self, keep: int = KEPT_VERSIONS) -> int:
        """Keep each device's reports on its ``keep`` newest versions of each model; the
        rows removed. One statement for the whole fleet (the gateway runs it every
        minute): reports are accepted only for versions the device's group was
        offered, and this bounds even those as releases add up."""
        return self._run(
            "DELETE FROM reports WHERE (SELECT COUNT(*) FROM reports AS newer "
            "WHERE newer.device = reports.device AND newer.name = reports.name "
            "AND newer.version > reports.version) >= :keep",
            keep=keep,
        )

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
        variant: str = "",
        latency_ms: float | None = None,
    ) -> Rollout | None:
        """Record a device's report (``serving``: the version it serves after it;
        ``variant`` and ``latency_ms``: what its smoke test ran and measured); pause the
        rollout when failures reach its threshold.

        Only the reports of devices in the rollout's slice of its group count.
        Returns the rollout if this report paused it.
        """
        now = self._clock()
        with self.database.begin() as connection:
            if serving is not None:
                connection.execute(
                    sa.text(
                        "INSERT INTO serving (device, name, version, at) "
                        "VALUES (:device, :name, :serving, :now) ON CONFLICT (device, name) "
                        "DO UPDATE SET version=excluded.version, at=excluded.at"
                    ),
                    {"device": device, "name": name, "serving": serving, "now": now},
                )
            # a refusal of the metadata says nothing of a version the device installed
            connection.execute(
                sa.text(
                    "INSERT INTO reports (device, name, version, status, detail, at, grp, "
                    "variant, latency_ms) VALUES (:device, :name, :version, :status, :detail, "
                    ":now, :grp, :variant, :latency) "
                    "ON CONFLICT (device, name, version) DO UPDATE SET status=excluded.status, "
                    "detail=excluded.detail, at=excluded.at, grp=excluded.grp, "
                    "variant=excluded.variant, latency_ms=excluded.latency_ms "
                    "WHERE NOT (excluded.status = 'refused' AND reports.status = 'installed')"
                ),
                {"device": device, "name": name, "version": version, "status": status,
                 "detail": detail[:500], "now": now, "grp": group, "variant": variant[:64],
                 "latency": latency_ms},
            )  # fmt: skip
        if status not in FAILURES:
            return None
        return self._pause_if_failing(device, group, name, version, detail)

    def _pause_if_failing(
        self, device: str, group: str, name: str, version: int, detail: str
    ) -> Rollout | None:
        """After a failure ``device`` reported: pause the active rollout of ``name``
        ``version`` to ``group`` if its slice's failures reach the threshold (one
        conditional statement: of two replicas, one pauses it). The rollout if paused."""
        rollout = self.get(name, version, group)
        if rollout is None or rollout.state != "active":
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
        paused = self._run(
            "UPDATE rollouts SET state='paused', reason=:reason, updated=:now "
            "WHERE name=:name AND version=:version AND grp=:grp AND state='active'",
            reason=reason, now=self._clock(), name=name, version=version, grp=group,
        )  # fmt: skip
        return self.get(name, version, group) if paused else None

    def stats(self, name: str, version: int, group: str) -> dict[str, int]:
        """Report counts of the rollout of ``name`` ``version`` to ``group``, from its slice."""
        rollout = self.get(name, version, group)
        percent = rollout.percent if rollout is not None else 0.0
        rows = self._all(
            "SELECT device, status FROM reports WHERE name=:name AND version=:version "
            "AND grp=:grp",
            name=name, version=version, grp=group,
        )  # fmt: skip
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
        rows = self._all(
            "SELECT status, detail FROM reports WHERE device=:device AND name=:name "
            "AND version=:version",
            device=device, name=name, version=version,
        )  # fmt: skip
        row = rows[0] if rows else None
        return (str(row[0]), str(row[1])) if row else None

    def assignment(self, device: str, group: str) -> tuple[dict[str, int], list[tuple[str, int]]]:
        """What :meth:`plan` and :meth:`withdrawn` say, from two reads (the group's
        rollouts, the device's reports): an update check costs the database that, and
        the write that records it, however many rollouts the group has."""
        with self.database.begin() as connection:
            rollouts = list(
                connection.execute(
                    sa.text(
                        "SELECT name, version, percent, state, started FROM rollouts WHERE grp=:grp"
                    ),
                    {"grp": group},
                )
            )
            reports = {
                (row.name, row.version): (row.status, row.at)
                for row in connection.execute(
                    sa.text("SELECT name, version, status, at FROM reports WHERE device=:device"),
                    {"device": device},
                )
            }
        return decide(device, rollouts, reports)

    def plan(self, device: str, group: str) -> dict[str, int]:
        """Model name -> the version this device should run (absent: no rollout for it)."""
        return self.assignment(device, group)[0]

    def withdrawn(self, device: str, group: str) -> list[tuple[str, int]]:
        """Aborted versions above what :meth:`plan` gives, that this device reported installed.

        Only those: an agent older than the ``withdrawn`` mark would take
        such an entry for a version to install.
        """
        return self.assignment(device, group)[1]


def decide(
    device: str, rollouts: list[Any], reports: dict[tuple[str, int], tuple[str, float]]
) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """The plan of the module docstring, pure: the device's versions, and the aborted
    versions it should leave. ``rollouts``: its group's (``name``, ``version``,
    ``percent``, ``state``, ``started``); ``reports``: the device's, by (name, version),
    (status, when)."""
    chosen: dict[str, int] = {}
    for rollout in rollouts:
        if rollout.state == "aborted" or not in_slice(device, rollout.name, rollout.percent):
            continue
        status, at = reports.get((rollout.name, rollout.version), (None, 0.0))
        if status in ("failed", "rolled_back") and at >= rollout.started:
            continue  # left or failed since this rollout last started
        if rollout.state == "paused" and status != "installed":
            continue
        if rollout.version > chosen.get(rollout.name, 0):
            chosen[rollout.name] = rollout.version
    withdrawn = {
        (r.name, r.version)
        for r in rollouts
        if r.state == "aborted"
        and r.version > chosen.get(r.name, 0)
        and reports.get((r.name, r.version), ("",))[0] == "installed"
    }
    return chosen, sorted(withdrawn)
