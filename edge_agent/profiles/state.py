"""The device's state as the policy sees it: heat and load.

Read under the configurable root from the profile's thermal zones (above a
zone's throttle temperature: throttled; above its critical one: critical) and
from the load average per CPU (``proc/loadavg``: under a fake root without
one, the load is unknown and the policy does not act on it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from edge_agent.profiles.power import read_temperatures
from edge_agent.profiles.schema import DeviceProfile

__all__ = ["DeviceState", "read_cpu_load", "read_device_state"]


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
