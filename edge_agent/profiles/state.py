"""The device's state as the policy sees it: heat and load.

Read under the configurable root from the profile's thermal zones (above a
zone's throttle temperature: throttled; above its critical one: critical) and
from the load average per CPU (``proc/loadavg``: under a fake root without
one, the load is unknown and the policy does not act on it).

The policy asks on every request; :class:`Sampled` reads at most once a
second (the kernel itself updates the load average every 5 s).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from edge_agent.profiles.power import read_temperatures
from edge_agent.profiles.schema import DeviceProfile

__all__ = ["DeviceState", "Sampled", "read_cpu_load", "read_device_state"]

T = TypeVar("T")


@dataclass(frozen=True)
class DeviceState:
    throttled: bool = False
    critical: bool = False
    cpu_load: float | None = None  # load average over a minute, per CPU
    temperatures: tuple[tuple[str, float | None], ...] = ()


def read_device_state(profile: DeviceProfile, root: Path = Path("/")) -> DeviceState:
    temperatures = read_temperatures(profile.thermal_zones, root)
    throttled = critical = False
    for zone in profile.thermal_zones:
        value = temperatures.get(zone.name)
        if value is None:
            continue
        throttled = throttled or value >= zone.throttle_c
        critical = critical or value >= zone.critical_c
    return DeviceState(throttled, critical, read_cpu_load(root), tuple(temperatures.items()))


def read_cpu_load(root: Path = Path("/")) -> float | None:
    """The load average over a minute, per CPU (``None`` when unknown)."""
    try:
        return float((root / "proc/loadavg").read_text().split()[0]) / (os.cpu_count() or 1)
    except (OSError, ValueError, IndexError):
        return None


class Sampled(Generic[T]):
    """``read()`` at most once every ``max_age_s`` seconds; the last value between.

    For readings asked for on every request that change slowly (a file read
    under ``/proc`` or ``/sys`` costs ~10 µs each). Thread-safe: two threads may
    both read when the value is due, and either result is kept.
    """

    def __init__(
        self,
        read: Callable[[], T],
        max_age_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self.max_age_s = max_age_s
        self._clock = clock
        self._last: tuple[float, T] | None = None

    def __call__(self) -> T:
        now = self._clock()
        last = self._last
        if last is not None and now - last[0] < self.max_age_s:
            return last[1]
        value = self._read()
        self._last = (now, value)
        return value
