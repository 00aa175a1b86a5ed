"""Device profiles: what a kind of device is and how to run models on it.

A profile is a TOML file in ``device_profiles/`` (see the README for the
fields). Loading validates every field; a wrong one fails with the file, the
field and what was expected::

    device_profiles/raspberry-pi-5.toml: runtime.threads: expected an integer >= 1, got 0
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.config import DETECTORS
from edge_agent.profiles.cost import CostFigures
from edge_core.errors import ProfileError
from edge_core.fields import Fields, load_document
from edge_core.package import FORMATS, PRECISIONS
from edge_core.runtime.base import GRAPH_OPTIMIZATION_LEVELS, DelegateSpec, RuntimeOptions

__all__ = [
    "ARCHITECTURES",
    "DetectRules",
    "DeviceProfile",
    "OffloadPreferences",
    "PowerMode",
    "PrivacyPreferences",
    "ProfileStore",
    "ThermalZone",
    "load_profile",
]

ARCHITECTURES = ("aarch64", "x86_64", "armv7l")


@dataclass(frozen=True)
class DetectRules:
    """How to recognise the device. Every listed kind must match (any of its
    strings is enough); a generic profile matches any device of its arch."""

    device_tree_model: tuple[str, ...] = ()
    device_tree_compatible: tuple[str, ...] = ()
    nv_tegra_release: tuple[str, ...] = ()
    cpuinfo: tuple[str, ...] = ()
    generic: bool = False

    def kinds(self) -> int:
        return sum(
            bool(rule)
            for rule in (
                self.device_tree_model,
                self.device_tree_compatible,
                self.nv_tegra_release,
                self.cpuinfo,
            )
        )


@dataclass(frozen=True)
class PowerMode:
    """One power mode. Unset fields are left as they are, except the CPU frequency
    cap: a mode that sets the governor and no ``cpu_max_freq_khz`` runs at the
    hardware's maximum (so leaving powersave lifts its cap)."""

    name: str
    cpu_governor: str | None = None
    cpu_max_freq_khz: int | None = None
    nvpmodel: int | None = None
    jetson_clocks: bool | None = None


@dataclass(frozen=True)
class ThermalZone:
    """A temperature sensor (millidegrees Celsius in ``path``, under the root)."""

    name: str
    path: str
    throttle_c: float
    critical_c: float


@dataclass(frozen=True)
class OffloadPreferences:
    """How the device leans when a request could run either here or in the cloud."""

    prefer: str = "local"
    offload_when_throttled: bool = True


@dataclass(frozen=True)
class PrivacyPreferences:
    """The face detector this device can afford (``None``: the measured default).
    A cheaper one costs recall: docs/policy.md gives the figures."""

    detector: str | None = None
    scale: float | None = None
    threshold: float | None = None


@dataclass(frozen=True)
class DeviceProfile:
    id: str
    description: str
    arch: str
    detect: DetectRules
    precisions: tuple[str, ...]
    formats: tuple[str, ...]
    runtime: RuntimeOptions
    memory_budget_mb: int
    power_modes: tuple[PowerMode, ...]
    default_power_mode: str
    thermal_zones: tuple[ThermalZone, ...]
    offload: OffloadPreferences
    latency_budget_ms: float | None = None  # a new model's smoke test must run within it
    privacy: PrivacyPreferences = field(default_factory=PrivacyPreferences)
    cost: CostFigures | None = None  # compute and bandwidth, for latency predictions
    source: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def power_mode(self, name: str | None = None) -> PowerMode:
        """The power mode ``name`` (the default one when ``None``).

        Raises:
            ProfileError: no such mode.
        """
        name = name or self.default_power_mode
        for mode in self.power_modes:
            if mode.name == name:
                return mode
        known = ", ".join(m.name for m in self.power_modes)
        raise ProfileError(f"profile {self.id} has no power mode {name!r}; it has {known}")

    def to_dict(self) -> dict[str, Any]:
        rt = self.runtime
        return {
            "id": self.id,
            "description": self.description,
            "arch": self.arch,
            "precisions": list(self.precisions),
            "formats": list(self.formats),
            "runtime": {
                "threads": rt.threads,
                "warmup": rt.warmup,
                "onnx": {
                    "providers": list(rt.providers),
                    "graph_optimization": rt.graph_optimization,
                    "inter_op_threads": rt.inter_op_threads,
                    "allow_spinning": rt.allow_spinning,
                },
                "litert": {
                    "xnnpack": rt.xnnpack,
                    "delegates": [d.library for d in rt.delegates],
                },
            },
            "memory_budget_mb": self.memory_budget_mb,
            "latency_budget_ms": self.latency_budget_ms,
            "power": {
                "default": self.default_power_mode,
                "modes": [
                    {k: v for k, v in vars(mode).items() if v is not None}
                    for mode in self.power_modes
                ],
            },
            "thermal_zones": [vars(zone) for zone in self.thermal_zones],
            "offload": vars(self.offload),
            "privacy": {k: v for k, v in vars(self.privacy).items() if v is not None},
            "cost": self.cost.to_dict() if self.cost is not None else None,
            "source": str(self.source) if self.source else None,
        }


def _detect(fields: Fields) -> DetectRules:
    rules = DetectRules(
        device_tree_model=tuple(fields.str_list("device_tree_model", [])),
        device_tree_compatible=tuple(fields.str_list("device_tree_compatible", [])),
        nv_tegra_release=tuple(fields.str_list("nv_tegra_release", [])),
        cpuinfo=tuple(fields.str_list("cpuinfo", [])),
        generic=fields.boolean("generic", False),
    )
    fields.done()
    if not rules.generic and rules.kinds() == 0:
        raise fields.fail(None, "expected at least one rule, or generic = true")
    return rules


def _runtime(
    fields: Fields,
) -> tuple[tuple[str, ...], tuple[str, ...], RuntimeOptions, int, float | None]:
    precisions = fields.str_list("precisions", choices=PRECISIONS)
    formats = fields.str_list("formats", choices=FORMATS)
    for key, values in (("precisions", precisions), ("formats", formats)):
        if not values:
            raise fields.fail(key, "expected at least one entry")
    threads = fields.integer("threads", None, minimum=1)
    warmup = fields.integer("warmup", minimum=0)
    memory_budget_mb = fields.integer("memory_budget_mb", minimum=1)
    latency_budget_ms = fields.number("latency_budget_ms", None, minimum=0.0)

    onnx = fields.table("onnx", None)
    providers = onnx.str_list("providers", ["CPUExecutionProvider"])
    provider_options: dict[str, dict[str, str]] = {}
    options_table = onnx.table("provider_options", None)
    for name in options_table.names():
        if name not in providers:
            raise options_table.fail(name, f"options for a provider not in providers ({providers})")
        entries = options_table.table(name)
        provider_options[name] = {key: str(entries.raw(key)) for key in entries.names()}
    options_table.done()
    graph = onnx.string("graph_optimization", "all", choices=GRAPH_OPTIMIZATION_LEVELS)
    inter_op = onnx.integer("inter_op_threads", None, minimum=1)
    spinning = onnx.boolean("allow_spinning", True)
    onnx.done()

    litert = fields.table("litert", None)
    xnnpack = litert.boolean("xnnpack", True)
    delegates = []
    for item in litert.tables("delegates", None):
        delegate_options = item.table("options", None)
        delegates.append(
            DelegateSpec(
                library=item.string("library"),
                options={key: str(delegate_options.raw(key)) for key in delegate_options.names()},
            )
        )
        delegate_options.done()
        item.done()
    litert.done()
    fields.done()
    options = RuntimeOptions(
        threads=threads,
        inter_op_threads=inter_op,
        graph_optimization=graph,
        providers=tuple(providers),
        provider_options=provider_options,
        allow_spinning=spinning,
        delegates=tuple(delegates),
        xnnpack=xnnpack,
        warmup=warmup,
    )
    return tuple(precisions), tuple(formats), options, memory_budget_mb, latency_budget_ms


def _power(fields: Fields) -> tuple[tuple[PowerMode, ...], str]:
    modes = []
    for item in fields.tables("modes"):
        modes.append(
            PowerMode(
                name=item.string("name"),
                cpu_governor=item.string("cpu_governor", None),
                cpu_max_freq_khz=item.integer("cpu_max_freq_khz", None, minimum=1),
                nvpmodel=item.integer("nvpmodel", None, minimum=0),
                jetson_clocks=item.boolean("jetson_clocks", None),
            )
        )
        item.done()
    if not modes:
        raise fields.fail("modes", "expected at least one power mode")
    names = [mode.name for mode in modes]
    if len(set(names)) != len(names):
        raise fields.fail("modes", f"power mode names must be unique, got {names}")
    default = fields.string("default", names[0], choices=names)
    fields.done()
    return tuple(modes), default


def _thermal(fields: Fields) -> tuple[ThermalZone, ...]:
    zones = []
    for item in fields.tables("zones"):  # [] for a device without thermal zones
        throttle = item.number("throttle_c", minimum=-50.0, maximum=150.0)
        critical = item.number("critical_c", minimum=-50.0, maximum=150.0)
        if critical <= throttle:
            raise item.fail("critical_c", f"expected a temperature above throttle_c ({throttle})")
        path = item.string("path")
        zones.append(
            ThermalZone(
                name=item.string("name"),
                path=path.lstrip("/"),
                throttle_c=throttle,
                critical_c=critical,
            )
        )
        item.done()
    fields.done()
    return tuple(zones)


def _rates(fields: Fields, *, required: bool) -> dict[str, float]:
    """Operations a second (billions) per precision; ``fp32`` where any is given."""
    rates = {}
    for precision in fields.names():
        if precision not in PRECISIONS:
            raise fields.fail(precision, f"expected one of {', '.join(PRECISIONS)}")
        rates[precision] = fields.number(precision, minimum=1e-6)
    if "fp32" not in rates and (required or rates):
        raise fields.fail("fp32", "missing (required: the figure other precisions fall back to)")
    fields.done()
    return rates


def _cost(fields: Fields) -> CostFigures:
    """The optional ``[cost]`` table: the figures of the roofline latency estimate."""
    gops = _rates(fields.table("compute_gops"), required=True)
    figures = CostFigures(
        compute_gops=gops,
        elementwise_gops=_rates(fields.table("elementwise_gops", {}), required=False),
        depthwise_gops=_rates(fields.table("depthwise_gops", {}), required=False),
        bandwidth_gbs=fields.number("bandwidth_gbs", minimum=1e-6),
        efficiency=fields.number("efficiency", 1.0, minimum=1e-3, maximum=1.0),
        call_overhead_us=fields.number("call_overhead_us", 0.0, minimum=0.0),
        node_overhead_us=fields.number("node_overhead_us", 0.0, minimum=0.0),
        source=fields.string("source"),
    )
    fields.done()
    return figures


def load_profile(path: Path) -> DeviceProfile:
    """Load and validate one profile file.

    Raises:
        ProfileError: the file is missing, malformed, or a field is wrong.
    """
    fields = Fields(load_document(path, ProfileError), path=path, error=ProfileError)
    profile_id = fields.string("id")
    if profile_id != path.stem:
        raise fields.fail("id", f"expected the file's name {path.stem!r}, got {profile_id!r}")
    description = fields.string("description", "")
    arch = fields.string("arch", choices=ARCHITECTURES)
    detect = _detect(fields.table("detect"))
    precisions, formats, runtime, budget, latency_budget = _runtime(fields.table("runtime"))
    modes, default_mode = _power(fields.table("power"))
    zones = _thermal(fields.table("thermal"))
    offload_fields = fields.table("offload")
    offload = OffloadPreferences(
        prefer=offload_fields.string("prefer", choices=["local", "cloud"]),
        offload_when_throttled=offload_fields.boolean("offload_when_throttled"),
    )
    offload_fields.done()
    privacy_fields = fields.table("privacy", None)
    privacy = PrivacyPreferences(
        detector=privacy_fields.string("detector", None, choices=list(DETECTORS)),
        scale=privacy_fields.number("scale", None, minimum=0.25, maximum=2.0),
        threshold=privacy_fields.number("threshold", None, minimum=0.01, maximum=0.99),
    )
    privacy_fields.done()
    cost = _cost(fields.table("cost")) if fields.has("cost") else None
    fields.done()
    return DeviceProfile(
        id=profile_id,
        description=description,
        arch=arch,
        detect=detect,
        precisions=precisions,
        formats=formats,
        runtime=runtime,
        memory_budget_mb=budget,
        latency_budget_ms=latency_budget,
        power_modes=modes,
        default_power_mode=default_mode,
        thermal_zones=zones,
        offload=offload,
        privacy=privacy,
        cost=cost,
        source=path,
    )


class ProfileStore:
    """The profiles of one directory, by id."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.stem for p in self.root.glob("*.toml"))

    def get(self, name: str) -> DeviceProfile:
        """The profile ``name``.

        Raises:
            ProfileError: no such profile, or its file is wrong.
        """
        path = self.root / f"{name}.toml"
        if not path.is_file():
            known = ", ".join(self.names()) or "none"
            raise ProfileError(f"unknown profile {name!r} in {self.root}; known profiles: {known}")
        return load_profile(path)

    def __iter__(self) -> Iterator[DeviceProfile]:
        for name in self.names():
            yield self.get(name)
