"""Devices whose update checks fail, as they tell the gateway (``POST /v2/ota/check``).

A check that fails before it gets to any model (the signed metadata cannot be
fetched or read, the device's own state cannot be written) reports nothing
about a version, so without this the operator would see only a device that
never reports. The device says when its checks start failing and why, again
at most every few minutes while they keep failing (with how many in a row),
and once when one succeeds again (:mod:`edge_agent.ota.failures`). One row per
failing device, removed when it says a check succeeded: bounded by the fleet.
``rollout status`` and the dashboard show each failing device of a rollout's
slice beside the rollout's reports.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from cloud_gateway.fleet.health import ago
from cloud_gateway.state.database import StateDatabase

__all__ = ["MAX_DETAIL", "CheckStore", "describe_failing"]

MAX_DETAIL = 500  # characters of the reason kept (as a report's detail)


class CheckStore:
    def __init__(self, database: StateDatabase, *, clock: Callable[[], float] = time.time) -> None:
        self.database = database
        self._clock = clock

    def failing(self, device: str, group: str, failures: int, detail: str) -> None:
        """``device``'s checks fail (``failures`` in a row, the last for ``detail``); one
        upsert that keeps when the gateway first heard of it."""
        with self.database.begin() as connection:
            connection.execute(
                sa.text(
                    "INSERT INTO update_checks (device, grp, failures, detail, since, at) "
                    "VALUES (:device, :grp, :failures, :detail, :now, :now) "
                    "ON CONFLICT (device) DO UPDATE SET grp=excluded.grp, "
                    "failures=excluded.failures, detail=excluded.detail, at=excluded.at"
                ),
                {"device": device, "grp": group, "failures": failures,
                 "detail": detail[:MAX_DETAIL], "now": self._clock()},
            )  # fmt: skip

    def succeeded(self, device: str) -> None:
        """``device``'s checks succeed again: it is no longer shown as failing."""
        with self.database.begin() as connection:
            connection.execute(
                sa.text("DELETE FROM update_checks WHERE device=:device"), {"device": device}
            )

    def failing_devices(self, group: str | None = None) -> list[dict[str, Any]]:
        """The devices whose checks fail (of ``group``, or all), by device id: each with
        its group, ``failures``, ``detail``, ``since`` and ``at``."""
        with self.database.begin() as connection:
            rows = connection.execute(
                sa.text(
                    "SELECT device, grp, failures, detail, since, at FROM update_checks "
                    "WHERE :grp IS NULL OR grp=:grp ORDER BY device"
                ).bindparams(sa.bindparam("grp", type_=sa.String)),
                {"grp": group},
            )
            return [
                {"device": d, "group": g, "failures": f, "detail": t, "since": s, "at": a}
                for d, g, f, t, s, a in rows
            ]


def describe_failing(check: dict[str, Any], now: float) -> str:
    """``update checks failing: <reason> (<n> in a row, for <how long>)``, as ``rollout
    status`` says it."""
    return (
        f"update checks failing: {check['detail']} ({check['failures']} in a row, for "
        f"{ago(now - check['since'])})"
    )
