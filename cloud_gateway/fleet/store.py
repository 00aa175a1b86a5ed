"""The fleet's telemetry in the state database: each device's latest status, one
history point a minute (kept ``history_s``), the operators' actions.

Writes come in batches (:class:`~cloud_gateway.fleet.ingest.TelemetryIngest` flushes
once a second): one upsert statement per kind for every device heard from, and one
for their history points, whatever the number of devices. Replicas may write the same
device (a repeat, or the same telemetry through two of them): every write is an upsert
keyed by device (and minute), so the last one wins and nothing is counted twice.

One device never costs another its data: the checks of :mod:`.telemetry` make every
value fit its column, and should the database refuse a batch all the same, the batch
is written again in halves down to the one sample it refuses, which alone is dropped
(logged once a batch, with the count). A database that is down is not a bad row: its
error is raised as it came.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from cloud_gateway.fleet.health import Reading
from cloud_gateway.fleet.telemetry import history_columns
from cloud_gateway.state import schema
from cloud_gateway.state.database import StateDatabase

__all__ = ["FleetStore", "Sample", "blank_status"]

log = logging.getLogger(__name__)

MAX_ACTIONS = 10_000  # the audit log keeps this many, the newest
MAX_REPORTS = 100  # a device's reports shown on its page
_JSON_COLUMNS = ("models", "temperatures", "decisions", "latency", "link")
# what a database says of a row it cannot hold (a value out of its column's range or
# length); SQLite's driver raises OverflowError for an integer past 64 bits itself
_ROW_ERRORS = (sa.exc.DataError, sa.exc.IntegrityError, OverflowError)


@dataclass(frozen=True)
class Sample:
    """One telemetry document of a device, checked (:func:`~.telemetry.columns`)."""

    device: str
    kind: str
    at: float  # the gateway's clock
    minute: int  # its history point (from the device's own time when plausible)
    source: str  # mqtt | http
    seq: int | None
    values: dict[str, Any]


def _upsert(table: str, keys: tuple[str, ...], names: list[str], extra: str = "") -> sa.TextClause:
    columns = ", ".join(names)
    values = ", ".join(f":{n}" for n in names)
    updates = [f"{n}=excluded.{n}" for n in names if n not in keys and n != "degraded_at"]
    return sa.text(
        f"INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT ({', '.join(keys)}) "
        f"DO UPDATE SET {', '.join(updates + ([extra] if extra else []))}"
    )


# a rise of the degraded count since the last report is when it last answered degraded
_DEGRADED_ROSE = (
    "degraded_at=CASE WHEN device_status.degraded IS NOT NULL AND "
    "excluded.degraded > device_status.degraded THEN excluded.at "
    "ELSE device_status.degraded_at END"
)


def _loads(text: str | None) -> Any:
    if not text:
        return {}
    try:
        return json.loads(text)
    except ValueError:
        return {}


class FleetStore:
    def __init__(
        self,
        database: StateDatabase,
        *,
        history_s: float = 86400.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.database = database
        self.history_s = history_s
        self._clock = clock

    # -- writes ---------------------------------------------------------------------------

    def write(self, samples: Iterable[Sample]) -> int:
        """Store a batch (at most one sample per device and kind); how many were stored:
        all of them but those the database refused (logged).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (not one of the rows).
        """
        refused: list[tuple[Sample, Exception]] = []
        written = self._write_halves(list(samples), refused)
        if refused:
            (first, error), devices = refused[0], sorted({s.device for s, _ in refused})
            reason = str(getattr(error, "orig", None) or error).splitlines()[0][:200]
            log.warning(
                "telemetry: the database refused %d document(s) of %s, dropped them "
                "(the first, %s's %s: %s)", len(refused), ", ".join(devices[:5]),
                first.device, first.kind, reason,
            )  # fmt: skip
        return written

    def _write_halves(self, batch: list[Sample], refused: list[tuple[Sample, Exception]]) -> int:
        """The batch in one transaction; refused, each half of it again, down to the one
        sample refused (a few transactions for a bad row, not one per row)."""
        if not batch:
            return 0
        try:
            return self._write_batch(batch)
        except _ROW_ERRORS as exc:
            if len(batch) == 1:
                refused.append((batch[0], exc))
                return 0
        middle = len(batch) // 2
        return self._write_halves(batch[:middle], refused) + self._write_halves(
            batch[middle:], refused
        )

    def _write_batch(self, samples: list[Sample]) -> int:
        by_kind: dict[str, list[dict[str, Any]]] = {}
        points: dict[tuple[str, int], dict[str, Any]] = {}
        count = 0
        for sample in samples:
            count += 1
            row = {"device": sample.device, "at": sample.at, "source": sample.source,
                   "seq": sample.seq, **sample.values}  # fmt: skip
            if sample.kind == "decisions":
                row["degraded_at"] = sample.at if row.get("degraded") else 0.0
            by_kind.setdefault(sample.kind, []).append(row)
            point = points.setdefault(
                (sample.device, sample.minute), {"device": sample.device, "minute": sample.minute}
            )
            point.update(history_columns(sample.kind, sample.values))
        if not count:
            return 0
        with self.database.begin() as connection:
            for kind, rows in by_kind.items():
                names = list(rows[0])
                extra = _DEGRADED_ROSE if kind == "decisions" else ""
                connection.execute(_upsert("device_status", ("device",), names, extra), rows)
            # points of one shape each (the kinds a minute had), one statement a shape
            shapes: dict[tuple[str, ...], list[dict[str, Any]]] = {}
            for point in points.values():
                shapes.setdefault(tuple(point), []).append(point)
            for shape, points_of in shapes.items():
                connection.execute(
                    _upsert("device_history", ("device", "minute"), list(shape)), points_of
                )
        return count

    def set_online(self, states: dict[str, tuple[str, float]]) -> None:
        """What devices' status topics said (``online`` / ``offline``), and when."""
        if not states:
            return
        rows = [{"device": d, "at": 0.0, "online": s, "online_at": at}
                for d, (s, at) in states.items()]  # fmt: skip
        with self.database.begin() as connection:
            connection.execute(
                sa.text(
                    "INSERT INTO device_status (device, at, online, online_at) "
                    "VALUES (:device, :at, :online, :online_at) ON CONFLICT (device) DO UPDATE "
                    "SET online=excluded.online, online_at=excluded.online_at "
                    "WHERE excluded.online_at >= device_status.online_at"
                ),
                rows,
            )

    def prune(self) -> int:
        """Drop history points older than ``history_s`` and the oldest actions past
        :data:`MAX_ACTIONS`; how many points went."""
        oldest = int((self._clock() - self.history_s) // 60)
        table = schema.device_history
        actions = schema.actions
        with self.database.begin() as connection:
            gone = connection.execute(table.delete().where(table.c.minute < oldest)).rowcount
            newest = connection.execute(sa.select(sa.func.max(actions.c.id))).scalar()
            if newest is not None and newest > MAX_ACTIONS:
                connection.execute(actions.delete().where(actions.c.id <= newest - MAX_ACTIONS))
        return int(gone or 0)

    def forget(self, device: str) -> None:
        with self.database.begin() as connection:
            for table in (schema.device_status, schema.device_history):
                connection.execute(table.delete().where(table.c.device == device))

    # -- reads ----------------------------------------------------------------------------

    _LIST = ("device", "at", "source", "interval_s", "profile", "models", "throttled",
             "critical", "hottest", "breaker", "degraded_at", "online", "online_at")  # fmt: skip

    def statuses(self) -> dict[str, dict[str, Any]]:
        """Every device's latest status (the columns the Fleet page needs)."""
        table = schema.device_status
        with self.database.begin() as connection:
            # plain tuples zipped with the names: mappings cost a third of a 10,000-device
            # page's time
            rows = connection.execute(sa.select(*[table.c[n] for n in self._LIST])).all()
        names = self._LIST
        out = {row[0]: dict(zip(names, row, strict=True)) for row in rows}
        for status in out.values():
            status["models"] = _loads(status["models"])
        return out

    def status(self, device: str) -> dict[str, Any] | None:
        table = schema.device_status
        with self.database.begin() as connection:
            row = connection.execute(sa.select(table).where(table.c.device == device)).mappings()
            found = row.first()
        if found is None:
            return None
        out = dict(found)
        for name in _JSON_COLUMNS:
            out[name] = _loads(out[name])
        return out

    def history(self, device: str, since: float) -> list[dict[str, Any]]:
        """The device's points since ``since``, oldest first."""
        table = schema.device_history
        with self.database.begin() as connection:
            rows = connection.execute(
                sa.select(table)
                .where(table.c.device == device, table.c.minute >= int(since // 60))
                .order_by(table.c.minute)
            ).mappings()
            out = [dict(row) for row in rows]
        for row in out:
            row["decisions"] = _loads(row["decisions"])
        return out

    def reports_of(self, device: str, limit: int = MAX_REPORTS) -> list[dict[str, Any]]:
        """The device's update reports (installs, failures, rollbacks, refusals), newest
        first."""
        table = schema.reports
        with self.database.begin() as connection:
            rows = connection.execute(
                sa.select(table.c.name, table.c.version, table.c.status, table.c.detail,
                          table.c.at, table.c.variant, table.c.latency_ms)
                .where(table.c.device == device)
                .order_by(table.c.at.desc())
                .limit(limit)
            ).mappings()  # fmt: skip
            return [dict(row) for row in rows]

    def smoke_latency(self) -> dict[tuple[str, int], dict[str, Any]]:
        """Per published version, what the devices that installed it measured in their
        smoke tests: the median latency and the variants, from the reports."""
        table = schema.reports
        with self.database.begin() as connection:
            rows = connection.execute(
                sa.select(table.c.name, table.c.version, table.c.variant, table.c.latency_ms).where(
                    table.c.status == "installed", table.c.latency_ms.is_not(None)
                )
            ).all()
        grouped: dict[tuple[str, int], list[tuple[str, float]]] = {}
        for name, version, variant, latency in rows:
            grouped.setdefault((name, version), []).append((variant, float(latency)))
        out = {}
        for key, values in grouped.items():
            latencies = sorted(v for _, v in values)
            out[key] = {
                "median_ms": latencies[len(latencies) // 2],
                "devices": len(latencies),
                "variants": sorted({v for v, _ in values if v}),
            }
        return out

    def record_action(self, actor: str, action: str, target: str, detail: str = "") -> None:
        with self.database.begin() as connection:
            connection.execute(
                schema.actions.insert().values(
                    at=self._clock(), actor=actor, action=action, target=target[:300],
                    detail=detail[:1000],
                )
            )  # fmt: skip

    def actions(self, limit: int = 50) -> list[dict[str, Any]]:
        table = schema.actions
        with self.database.begin() as connection:
            rows = connection.execute(
                sa.select(table).order_by(table.c.id.desc()).limit(limit)
            ).mappings()
            return [dict(row) for row in rows]


def blank_status() -> dict[str, Any]:
    """A device's status before its first telemetry: every column of a status row
    (:meth:`FleetStore.status`), none known, so that a page shows "–" for each rather
    than failing on a missing one."""
    out: dict[str, Any] = dict.fromkeys(schema.device_status.columns.keys())
    out.update({name: {} for name in _JSON_COLUMNS})
    return out


def reading(row: dict[str, Any] | None) -> Reading | None:
    """The health rule's view of a status row."""
    if row is None:
        return None
    return Reading(
        at=float(row.get("at") or 0.0),
        interval_s=row.get("interval_s"),
        throttled=bool(row.get("throttled")),
        critical=bool(row.get("critical")),
        hottest=row.get("hottest"),
        breaker=row.get("breaker"),
        degraded_at=float(row.get("degraded_at") or 0.0),
        online=row.get("online") or "",
        online_at=float(row.get("online_at") or 0.0),
    )
