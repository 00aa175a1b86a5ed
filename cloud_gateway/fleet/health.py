"""The health rule: healthy, hot, degraded or offline, and the sentence that says why.

Pure: a function of what the device last said (its ``device_status`` row, as a
:class:`Reading`), when it was last heard from at all (telemetry, an update check, a
request) and the time, passed in. The first rule that holds decides:

1. **offline**: its broker connection's last will said so (and nothing came since), or
   nothing was heard for :data:`MISSED_INTERVALS` of its reporting intervals (the
   ``interval_s`` its status carries: 30 s of MQTT telemetry, or its update checks'
   interval over HTTP; :data:`DEFAULT_INTERVAL_S` when it says none), or never;
2. **hot**: its last status says throttled or critical (a thermal zone at or past its
   profile's throttle point);
3. **degraded**: its offload breaker is not closed, or it gave a degraded answer (the
   cloud wanted and not reached) within :data:`DEGRADED_WINDOW_S`;
4. **healthy**: none of those.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEGRADED_WINDOW_S",
    "HEALTH",
    "MISSED_INTERVALS",
    "Health",
    "Reading",
    "ago",
    "health",
]

HEALTH = ("healthy", "hot", "degraded", "offline")
DEFAULT_INTERVAL_S = 30.0
MISSED_INTERVALS = 3
DEGRADED_WINDOW_S = 300.0


@dataclass(frozen=True)
class Reading:
    """What the health rule reads of a device's latest telemetry."""

    at: float = 0.0  # when its telemetry last arrived (0: never)
    interval_s: float | None = None
    throttled: bool = False
    critical: bool = False
    hottest: float | None = None
    breaker: str | None = None
    degraded_at: float = 0.0  # when its count of degraded answers last rose
    online: str = ""  # what its status topic said last ("online", "offline", "")
    online_at: float = 0.0


@dataclass(frozen=True)
class Health:
    state: str  # one of HEALTH
    rule: str  # the rule that decided, in a sentence


def ago(seconds: float) -> str:
    """How long ago, as a person says it: 12 s, 4 min, 3 h, 2 days."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{max(seconds, 0):.0f} s"


def health(reading: Reading | None, last_seen: float | None, now: float) -> Health:
    """The device's health now. ``last_seen``: when it was last heard from in any way."""
    reading = reading or Reading()
    heard = max(reading.at, last_seen or 0.0, reading.online_at if reading.online else 0.0)
    if heard <= 0:
        return Health("offline", "offline: never heard from")
    if reading.online == "offline" and reading.online_at >= heard:
        return Health(
            "offline",
            f"offline: its broker connection closed {ago(now - reading.online_at)} ago "
            "(its last will, or a clean stop), and nothing came since",
        )
    interval = reading.interval_s or DEFAULT_INTERVAL_S
    silent = now - heard
    if silent > MISSED_INTERVALS * interval:
        return Health(
            "offline",
            f"offline: nothing heard for {ago(silent)}, more than {MISSED_INTERVALS} "
            f"reporting intervals of {ago(interval)}",
        )
    if reading.critical or reading.throttled:
        where = f" (hottest zone {reading.hottest:.1f} °C)" if reading.hottest is not None else ""
        what = "critical" if reading.critical else "throttled"
        return Health(
            "hot",
            f"hot: its last status says {what}{where}: a thermal zone at or past its "
            "profile's limit",
        )
    if reading.breaker not in (None, "", "closed"):
        return Health(
            "degraded", f"degraded: its offload breaker is {reading.breaker} (the cloud fails)"
        )
    since = now - reading.degraded_at
    if reading.degraded_at > 0 and since < DEGRADED_WINDOW_S:
        return Health(
            "degraded",
            f"degraded: it answered degraded {ago(since)} ago (the cloud wanted, not reached; "
            f"degraded within the last {ago(DEGRADED_WINDOW_S)})",
        )
    return Health(
        "healthy",
        f"healthy: heard from {ago(silent)} ago, not throttled, offload breaker closed, no "
        f"degraded answer in the last {ago(DEGRADED_WINDOW_S)}",
    )
