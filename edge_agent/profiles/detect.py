"""Which profile fits this device, from what the system says about itself.

Reads, under a configurable root (``/`` on a device, a fake tree in tests):

- ``proc/device-tree/model`` and ``proc/device-tree/compatible`` (ARM boards),
- ``etc/nv_tegra_release`` (NVIDIA Jetson, L4T),
- ``proc/cpuinfo`` (architecture and CPU features such as ``avx512_vnni``,
  ``asimddp``, ``i8mm`` that make INT8 pay off),
- ``proc/meminfo`` (memory).

Under any root other than this machine's ``/`` nothing comes from the host:
the architecture is read from ``proc/cpuinfo`` or inferred from a device tree
or ``nv_tegra_release`` (ARM boards are ``aarch64``), and a root that does not
exist is an error, not this machine.

:func:`read_facts` does the reading; :func:`match_profile` is pure. A profile
matches when every kind of rule it lists matches; the most specific match
wins. Unknown hardware gets the generic profile of its architecture, with a
warning.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.profiles.schema import DeviceProfile, ProfileStore
from edge_core.errors import ProfileError
from edge_core.fields import is_decimal
from edge_core.logs import warn_once
from edge_core.paths import default_profiles_dir

__all__ = [
    "Detection",
    "DeviceFacts",
    "detect_profile",
    "match_profile",
    "read_facts",
    "resolve_profile",
]

log = logging.getLogger(__name__)

_ARCH_ALIASES = {
    "arm64": "aarch64",
    "aarch64": "aarch64",
    "amd64": "x86_64",
    "x86_64": "x86_64",
    "armv7l": "armv7l",
    "armv8l": "armv7l",  # a 32-bit userland on a 64-bit CPU (its wheels are armv7l's)
    "armv6l": "armv6l",
}


@dataclass(frozen=True)
class DeviceFacts:
    """What the system says about itself."""

    arch: str
    device_tree_model: str = ""
    device_tree_compatible: tuple[str, ...] = ()
    nv_tegra_release: str = ""
    cpuinfo: str = ""
    cpu_features: frozenset[str] = frozenset()
    cpu_count: int = 0
    memory_mb: int = 0


@dataclass(frozen=True)
class Detection:
    profile: DeviceProfile
    reason: str
    generic: bool
    facts: DeviceFacts
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile.id,
            "description": self.profile.description,
            "reason": self.reason,
            "generic": self.generic,
            "arch": self.facts.arch,
            "device_tree_model": self.facts.device_tree_model or None,
            "nv_tegra_release": self.facts.nv_tegra_release or None,
            "cpu_count": self.facts.cpu_count,
            "memory_mb": self.facts.memory_mb,
            "int8_features": sorted(self.facts.cpu_features & INT8_FEATURES),
            "warnings": self.warnings,
        }


#: CPU features that speed up INT8 inference (x86 VNNI/AMX, ARM dot product / i8mm).
INT8_FEATURES = frozenset(
    {"avx512_vnni", "avx_vnni", "amx_int8", "avx512bw", "avx2", "asimddp", "i8mm", "sve2"}
)


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _arch_from_cpuinfo(cpuinfo: str) -> str | None:
    """The architecture ``/proc/cpuinfo`` describes. A 32-bit ARM kernel (Raspberry Pi
    OS 32-bit, even on a 64-bit CPU) says ``ARMv7 Processor ... (v7l)`` and lists ``neon``
    and ``vfpv4`` rather than ``asimd``; a 64-bit one says ``CPU architecture: 8``."""
    lowered = cpuinfo.lower()
    if "vendor_id" in lowered and "flags" in lowered:
        return "x86_64"
    if "(v7l)" in lowered or "armv7 processor" in lowered or "cpu architecture: 7" in lowered:
        return "armv7l"
    if "cpu architecture: 8" in lowered or ("features" in lowered and "asimd" in lowered):
        return "aarch64"
    return None


def _cpu_features(cpuinfo: str) -> frozenset[str]:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return frozenset(value.split())
    return frozenset()


def _host_arch() -> str:
    machine = platform.machine().lower()
    return _ARCH_ALIASES.get(machine, machine)


def read_facts(root: Path = Path("/")) -> DeviceFacts:
    """Read the device's facts under ``root`` (missing files read as empty).

    The architecture comes from ``proc/cpuinfo``; failing that, a device tree
    or ``etc/nv_tegra_release`` means an ARM board (``aarch64``). Only when
    ``root`` is this machine's own ``/`` is the running interpreter asked
    (``platform.machine()``): another root is another system, and the host
    must not leak into it.

    Raises:
        ProfileError: ``root`` does not exist or is not a directory, or
            nothing under it tells the architecture.
    """
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise ProfileError(f"cannot detect the device under {root}: the root {what}")
    cpuinfo = _read_text(root / "proc/cpuinfo")
    model = _read_text(root / "proc/device-tree/model").strip("\x00\n ")
    compatible = tuple(
        part for part in _read_text(root / "proc/device-tree/compatible").split("\x00") if part
    )
    tegra = _read_text(root / "etc/nv_tegra_release").strip()
    arch = _arch_from_cpuinfo(cpuinfo)
    if arch is None and (model or compatible or tegra):
        arch = "aarch64"  # a device tree and nothing else to go by: the usual board's
    if root.resolve() == Path("/").resolve() and _host_arch() in ("armv7l", "aarch64"):
        # what runs here is the interpreter's: a 32-bit userland on a 64-bit kernel
        # (cpuinfo says 8) takes armv7l wheels, and so the armv7l profiles
        arch = _host_arch()
    if arch is None:
        if root.resolve() != Path("/").resolve():
            raise ProfileError(
                f"cannot tell the architecture of the device under {root}: no "
                "proc/cpuinfo, proc/device-tree or etc/nv_tegra_release there"
            )
        arch = _host_arch()
    memory_mb = 0
    for line in _read_text(root / "proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and is_decimal(parts[1]):
                memory_mb = int(parts[1]) // 1024
    return DeviceFacts(
        arch=arch,
        device_tree_model=model,
        device_tree_compatible=compatible,
        nv_tegra_release=tegra,
        cpuinfo=cpuinfo,
        cpu_features=_cpu_features(cpuinfo),
        cpu_count=sum(1 for line in cpuinfo.splitlines() if line.startswith("processor")),
        memory_mb=memory_mb,
    )


def _matches(profile: DeviceProfile, facts: DeviceFacts) -> list[str] | None:
    """The reasons ``profile`` matches ``facts``, or ``None`` when it does not."""
    rules = profile.detect
    if rules.generic or profile.arch != facts.arch:
        return None
    reasons = []
    checks: list[tuple[tuple[str, ...], Iterable[str], str]] = [
        (rules.device_tree_model, [facts.device_tree_model], "device-tree model"),
        (rules.device_tree_compatible, facts.device_tree_compatible, "device-tree compatible"),
        (rules.nv_tegra_release, [facts.nv_tegra_release], "/etc/nv_tegra_release"),
        (rules.cpuinfo, [facts.cpuinfo], "/proc/cpuinfo"),
    ]
    for wanted, haystacks, what in checks:
        if not wanted:
            continue
        values = list(haystacks)
        hit = next((w for w in wanted for value in values if value and w in value), None)
        if hit is None:
            return None
        reasons.append(f"{what} contains {hit!r}")
    return reasons


def match_profile(profiles: Iterable[DeviceProfile], facts: DeviceFacts) -> Detection:
    """The profile for ``facts``: the most specific match, else the generic one of its arch.

    Raises:
        ProfileError: nothing matches and there is no generic profile for the arch.
    """
    candidates = list(profiles)
    matches = []
    for profile in candidates:
        reasons = _matches(profile, facts)
        if reasons is not None:
            matches.append((profile.detect.kinds(), profile.id, profile, reasons))
    if matches:
        matches.sort(key=lambda m: (-m[0], m[1]))
        _, _, best, reasons = matches[0]
        warnings = []
        if len(matches) > 1 and matches[1][0] == matches[0][0]:
            warnings.append(f"profiles {best.id} and {matches[1][1]} both match; using {best.id}")
        return Detection(best, "; ".join(reasons), False, facts, warnings)
    generic = [p for p in candidates if p.detect.generic and p.arch == facts.arch]
    if not generic:
        raise ProfileError(
            f"no profile matches this device (arch {facts.arch}, model "
            f"{facts.device_tree_model or 'unknown'}) and there is no generic profile "
            f"for {facts.arch}"
        )
    chosen = sorted(generic, key=lambda p: p.id)[0]
    described = facts.device_tree_model or "this device"
    warning = f"unknown hardware ({described}); using the generic {facts.arch} profile {chosen.id}"
    log.warning(warning)
    return Detection(chosen, f"generic profile for {facts.arch}", True, facts, [warning])


def detect_profile(profiles: Iterable[DeviceProfile], root: Path = Path("/")) -> Detection:
    """Read the facts under ``root`` and match them (see :func:`match_profile`).

    Raises:
        ProfileError: see :func:`read_facts` and :func:`match_profile`.
    """
    return match_profile(profiles, read_facts(root))


def resolve_profile(
    name: str | None, *, root: Path = Path("/"), profiles_dir: Path | None = None
) -> tuple[DeviceProfile, Detection | None]:
    """The profile named ``name``, else the one detected under ``root``, from the
    profiles in ``profiles_dir`` (default: the bundled ones). Every command and
    the service resolve a profile here, so the same arguments give the same one.

    Raises:
        ProfileError: no such profile, a profile file is wrong, or nothing matches.
    """
    store = ProfileStore(profiles_dir or default_profiles_dir())
    if name:
        profile, detection = store.get(name), None
    else:
        detection = detect_profile(list(store), root)
        profile = detection.profile
    host = _host_arch()
    if root.resolve() == Path("/").resolve() and profile.arch != host:
        warning = (
            f"profile {profile.id} is for {profile.arch} devices and this machine is {host}: "
            "its runtimes, delegates and power modes may not apply here"
        )
        warn_once(log, warning)
        if detection is not None:
            detection.warnings.append(warning)
    return profile, detection
