"""Device profiles: loading (:mod:`.schema`), detection (:mod:`.detect`),
power modes and temperatures (:mod:`.power`)."""

from edge_agent.profiles.detect import (
    Detection,
    DeviceFacts,
    detect_profile,
    match_profile,
    read_facts,
    resolve_profile,
)
from edge_agent.profiles.power import (
    Action,
    PowerError,
    apply_plan,
    plan_power_mode,
    read_temperatures,
)
from edge_agent.profiles.schema import (
    DetectRules,
    DeviceProfile,
    OffloadPreferences,
    PowerMode,
    ProfileStore,
    ThermalZone,
    load_profile,
)

__all__ = [
    "Action",
    "DetectRules",
    "Detection",
    "DeviceFacts",
    "DeviceProfile",
    "OffloadPreferences",
    "PowerError",
    "PowerMode",
    "ProfileStore",
    "ThermalZone",
    "apply_plan",
    "detect_profile",
    "load_profile",
    "match_profile",
    "plan_power_mode",
    "read_facts",
    "read_temperatures",
    "resolve_profile",
]
