"""What the dashboard shows, as plain values: one source for its pages and its JSON API.

Each view reads the registry (in memory), the fleet's telemetry, the rollouts and the
repositories, and returns dicts of plain values (the API returns them as they are; the
pages render them). Views are bounded: the fleet list is a page of at most
:data:`MAX_PAGE_SIZE` devices (the counts cover every device), a device's history its
kept hours, its reports the newest :data:`~.store.MAX_REPORTS`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from cloud_gateway.auth import Device, DeviceRegistry
from cloud_gateway.fleet.charts import device_charts
from cloud_gateway.fleet.health import HEALTH, ago, health
from cloud_gateway.fleet.store import FleetStore, reading
from cloud_gateway.ota.checks import CheckStore
from cloud_gateway.ota.published import published_versions
from cloud_gateway.ota.rollouts import Rollout, RolloutStore, in_slice
from cloud_gateway.repository import ServingRepository
from edge_core.errors import BadRequest, NotFound

__all__ = ["DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE", "FleetViews", "published_versions"]

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200


class FleetViews:
    def __init__(
        self,
        registry: DeviceRegistry,
        fleet: FleetStore,
        rollouts: RolloutStore,
        *,
        repository: ServingRepository | None = None,
        ota_repository: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.fleet = fleet
        self.rollouts = rollouts
        self.checks = CheckStore(rollouts.database)
        self.repository = repository
        self.ota_repository = ota_repository
        self._clock = clock

    def _devices(self) -> list[Device]:
        return [d for d in self.registry.devices() if d.role == "device"]

    @staticmethod
    def _models(status: dict[str, Any] | None, serving: dict[str, int]) -> list[dict[str, Any]]:
        """What the device runs: its telemetry's loaded models, else its reports'."""
        loaded = (status or {}).get("models") or {}
        if loaded:
            return [
                {"name": name, "version": entry.get("version"), "variant": entry.get("variant")}
                for name, entry in sorted(loaded.items())
                if isinstance(entry, dict)
            ]
        return [{"name": n, "version": v, "variant": ""} for n, v in sorted(serving.items())]

    # -- Fleet ----------------------------------------------------------------------------

    def fleet_list(
        self,
        *,
        group: str | None = None,
        model: str | None = None,
        state: str | None = None,
        page: int = 1,
        size: int = DEFAULT_PAGE_SIZE,
    ) -> dict[str, Any]:
        """A page of devices (filtered by group, model ``name`` or ``name:version``,
        health), and the counts of every device by health.

        Raises:
            BadRequest: an unknown health, a page or size out of range.
        """
        _check_query(state, page, size)
        now = self._clock()
        rows = self._rows(now)
        counts = dict.fromkeys(HEALTH, 0)
        for row in rows:
            counts[row["health"]] += 1
        versions = {
            (m["name"], m["version"])
            for row in rows
            for m in row["models"]
            if isinstance(m["version"], int)
        }
        selected = [r for r in rows if _matches(r, group, model, state)]
        pages = max(1, -(-len(selected) // size))
        page = min(page, pages)
        shown = selected[(page - 1) * size : page * size]
        for row in shown:  # the page's rows only: the rest are counted, never shown
            seen_at: float | None = row["last_seen"]
            row["last_seen_ago"] = f"{ago(now - seen_at)} ago" if seen_at else "never"
        return {
            "counts": {"total": len(rows), **counts},
            "matching": len(selected),
            "page": page,
            "pages": pages,
            "size": size,
            "filters": {"group": group, "model": model, "health": state},
            "groups": sorted({row["group"] for row in rows}),
            "model_versions": [f"{n}:{v}" for n, v in sorted(versions)],
            "devices": shown,
            "time": now,
        }

    def _rows(self, now: float) -> list[dict[str, Any]]:
        """A row of the fleet list for every device (three reads, whatever the fleet)."""
        statuses = self.fleet.statuses()
        seen = self.rollouts.last_seen()
        serving = self.rollouts.serving()
        return [
            self._row(
                device,
                statuses.get(device.id),
                seen.get(device.id, (None, "")),
                serving.get(device.id, {}),
                now,
            )
            for device in self._devices()
        ]

    def _row(
        self,
        device: Device,
        status: dict[str, Any] | None,
        seen: tuple[float | None, str],
        serving: dict[str, int],
        now: float,
    ) -> dict[str, Any]:
        """One device's row: its health by the rule (offline once revoked), what it runs,
        when and how it was last heard from."""
        at, what = seen
        verdict = health(reading(status), at, now)
        if device.revoked:
            verdict = type(verdict)("offline", "offline: its token is revoked")
        known = status or {}
        last = max(at or 0.0, known.get("at") or 0.0) or None
        return {
            "id": device.id,
            "group": device.group,
            "profile": known.get("profile") or "",
            "models": self._models(status, serving),
            "health": verdict.state,
            "rule": verdict.rule,
            "last_seen": last,
            "heard_by": what or (known.get("source") or ""),
            "revoked": device.revoked,
        }

    # -- Device ---------------------------------------------------------------------------

    def device(self, device_id: str) -> dict[str, Any]:
        """One device: its latest status, health, history charts, reports.

        Raises:
            NotFound: no such device.
        """
        device = self.registry.get(device_id)
        if device is None or device.role != "device":
            raise NotFound(f"no device {device_id!r}")
        now = self._clock()
        status = self.fleet.status(device_id)
        at, what = self.rollouts.last_seen().get(device_id, (None, ""))
        verdict = health(reading(status), at, now)
        since = now - self.fleet.history_s
        history = self.fleet.history(device_id, since)
        serving = self.rollouts.serving().get(device_id, {})
        last = max(at or 0.0, (status or {}).get("at") or 0.0) or None
        reports = self.fleet.reports_of(device_id)
        checks = self.checks.failing_devices(device.group)
        failing = next((self._failing(c, now) for c in checks if c["device"] == device_id), None)
        return {
            "id": device.id,
            "group": device.group,
            "revoked": device.revoked,
            "health": verdict.state if not device.revoked else "offline",
            "rule": verdict.rule if not device.revoked else "offline: its token is revoked",
            "last_seen": last,
            "last_seen_ago": f"{ago(now - last)} ago" if last else "never",
            "heard_by": what or ((status or {}).get("source") or ""),
            "status": status,
            "models": self._models(status, serving),
            "serving": serving,
            "history": history,
            "charts": device_charts(history, start := _chart_start(history, since, now), now),
            "charted_hours": (now - start) / 3600,
            "history_hours": self.fleet.history_s / 3600,
            "reports": [{**r, "ago": f"{ago(now - r['at'])} ago"} for r in reports],
            "update_checks": failing,
            "time": now,
        }

    @staticmethod
    def _failing(check: dict[str, Any], now: float) -> dict[str, Any]:
        """A device whose update checks fail, as the pages show it."""
        lasting, told = ago(now - check["since"]), ago(now - check["at"])
        return {**check, "lasting": lasting, "ago": f"{told} ago"}

    # -- Rollouts -------------------------------------------------------------------------

    def rollout_list(self) -> list[dict[str, Any]]:
        """Every rollout with its slice (the group's devices in it) and its counts."""
        by_group: dict[str, list[str]] = {}
        for device in self._devices():
            if not device.revoked:
                by_group.setdefault(device.group, []).append(device.id)
        rollouts = self.rollouts.all()
        failing = self.checks.failing_devices() if rollouts else []
        out = []
        for rollout in rollouts:
            out.append(self._rollout(rollout, by_group.get(rollout.group, []), failing))
        return out

    def _rollout(
        self, rollout: Rollout, group: list[str], failing: list[dict[str, Any]]
    ) -> dict[str, Any]:
        members = [d for d in group if in_slice(d, rollout.name, rollout.percent)]
        now = self._clock()
        in_it = set(members)
        stuck = [self._failing(c, now) for c in failing if c["device"] in in_it]
        stats = self.rollouts.stats(rollout.name, rollout.version, rollout.group)
        size = len(members)
        pending = max(size - stats["reported"], 0)
        scale = max(size, stats["reported"], 1)
        bar = []
        offset = 0.0
        for key in ("installed", "failed", "refused", "rolled_back"):
            width = 100.0 * stats[key] / scale
            bar.append({"key": key, "count": stats[key], "x": round(offset, 2),
                        "width": round(width, 2)})  # fmt: skip
            offset += width
        failed_share = stats["failed"] / max(stats["reported"], 1)
        return {
            **rollout.to_dict(),
            "key": f"{rollout.name}/{rollout.version}/{rollout.group}",
            "group_devices": len(group),
            "slice": size,
            "pending": pending,
            "stats": stats,
            "bar": bar,
            "failed_share": round(failed_share, 4),
            "done": size > 0 and stats["installed"] >= size,
            "failing_checks": stuck,  # devices of the slice whose update checks fail
        }

    def rollout(self, name: str, version: int, group: str) -> dict[str, Any]:
        """Raises: NotFound."""
        rollout = self.rollouts.get(name, version, group)
        if rollout is None:
            raise NotFound(f"no rollout of {name} v{version} for {group}")
        members = [d.id for d in self._devices() if d.group == group and not d.revoked]
        return self._rollout(rollout, members, self.checks.failing_devices(group))

    def slice_size(self, name: str, group: str, percent: float) -> int:
        """How many of the group's devices a rollout of ``name`` at ``percent`` holds."""
        return sum(
            1
            for d in self._devices()
            if d.group == group and not d.revoked and in_slice(d.id, name, percent)
        )

    # -- Models ---------------------------------------------------------------------------

    def model_list(self) -> list[dict[str, Any]]:
        """Each model: the versions the gateway serves (their variants), the versions
        published for devices, and which groups run which version."""
        models: dict[str, dict[str, Any]] = {}

        def entry(name: str) -> dict[str, Any]:
            return models.setdefault(name, {"name": name, "cloud": [], "published": [],
                                            "running": []})  # fmt: skip

        if self.repository is not None:
            for loaded in sorted(
                self.repository.loaded(),
                key=lambda m: (m.package.name, m.package.version),
            ):
                package = loaded.package
                entry(package.name)["cloud"].append(
                    {
                        "version": package.version,
                        "served": loaded.variant,
                        "engine": loaded.device,
                        "variants": [
                            {
                                "id": v.id,
                                "precision": v.precision,
                                "format": v.format,
                                "size": v.size,
                                "accuracy": v.accuracy,
                                "latency_ms": _benchmark_ms(v.benchmark),
                            }
                            for v in package.variants
                        ],
                    }
                )
        measured = self.fleet.smoke_latency()
        for version in published_versions(self.ota_repository):
            smoke = measured.get((version["name"], version["version"]), {})
            entry(version["name"])["published"].append(
                {
                    **version,
                    "latency_ms": smoke.get("median_ms"),
                    "measured_on": smoke.get("devices", 0),
                }
            )
        for (name, number, group), count in sorted(self._running().items()):
            entry(name)["running"].append({"version": number, "group": group, "devices": count})
        return [models[name] for name in sorted(models)]

    def _running(self) -> dict[tuple[str, int, str], int]:
        statuses = self.fleet.statuses()
        serving = self.rollouts.serving()
        counts: dict[tuple[str, int, str], int] = {}
        for device in self._devices():
            if device.revoked:
                continue
            for m in self._models(statuses.get(device.id), serving.get(device.id, {})):
                if isinstance(m["version"], int):
                    key = (m["name"], m["version"], device.group)
                    counts[key] = counts.get(key, 0) + 1
        return counts

    def actions(self, limit: int = 50) -> list[dict[str, Any]]:
        now = self._clock()
        return [{**a, "ago": f"{ago(now - a['at'])} ago"} for a in self.fleet.actions(limit)]


def _chart_start(history: list[dict[str, Any]], since: float, now: float) -> float:
    """Where a device's charts begin: its first kept point (a device heard from for an
    hour gets an hour's width, not a sliver of the day), at least 10 minutes back."""
    first = history[0]["minute"] * 60.0 if history else now
    return max(since, min(first, now - 600.0))


def _benchmark_ms(benchmark: Any) -> float | None:
    """The latency a build measured (``edge-agent models build``), if it recorded one."""
    if not isinstance(benchmark, dict):
        return None
    for key in ("p50_ms", "latency_ms", "mean_ms"):
        value = benchmark.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _check_query(state: str | None, page: int, size: int) -> None:
    """Raises: BadRequest (an unknown health, a page or size out of range)."""
    if state is not None and state not in HEALTH:
        raise BadRequest(f"health must be one of {', '.join(HEALTH)}")
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise BadRequest(f"size must be from 1 to {MAX_PAGE_SIZE}")
    if not 1 <= page <= 1_000_000:
        raise BadRequest("page must be from 1 to 1000000")


def _matches(row: dict[str, Any], group: str | None, model: str | None, state: str | None) -> bool:
    if group and row["group"] != group:
        return False
    if state and row["health"] != state:
        return False
    if model:
        name, _, version = model.partition(":")
        wanted: Iterable[dict[str, Any]] = (m for m in row["models"] if m["name"] == name)
        if version:
            wanted = (m for m in wanted if str(m["version"]) == version)
        if not any(True for _ in wanted):
            return False
    return True
