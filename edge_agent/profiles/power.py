"""Power modes and temperatures, read and written under a configurable root.

Applying a power mode is planned first (:func:`plan_power_mode`, which only
reads), then carried out (:func:`apply_plan`), so that a dry run prints the
exact plan. A plan writes sysfs files (``scaling_governor``,
``scaling_max_freq`` of each CPU) under the root and runs NVIDIA's tools
(``nvpmodel -m N``, ``jetson_clocks``) through an injectable runner.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from edge_agent.profiles.schema import DeviceProfile, PowerMode, ThermalZone
from edge_core.errors import EdgeError

__all__ = [
    "Action",
    "PowerError",
    "apply_plan",
    "plan_power_mode",
    "read_temperatures",
]

CPU_DIR = "sys/devices/system/cpu"


# where `jetson_clocks --store` keeps the clocks to restore (nvpmodel's own state
# directory, which every Jetson with nvpmodel has), relative to the root
JETSON_CLOCKS_SAVED = Path("var/lib/nvpmodel/edge-agent-clocks.conf")


class PowerError(EdgeError):
    """A power mode cannot be applied on this device."""


@dataclass(frozen=True)
class Action:
    """One step of a plan: write ``value`` into ``path``, remove ``path`` (no value),
    or run ``command``."""

    path: Path | None = None
    value: str | None = None
    command: tuple[str, ...] | None = None

    def describe(self) -> str:
        if self.command is not None:
            return "run " + " ".join(self.command)
        if self.value is None:
            return f"remove {self.path}"
        return f"write {self.value!r} to {self.path}"


Runner = Callable[[Sequence[str]], None]


def run_command(command: Sequence[str]) -> None:
    """Run a system tool; a failure raises :class:`PowerError`."""
    if shutil.which(command[0]) is None:
        raise PowerError(f"{command[0]} is not installed; cannot run {' '.join(command)}")
    try:
        subprocess.run(list(command), check=True, capture_output=True, timeout=60)
    except subprocess.CalledProcessError as exc:
        stderr = exc.stderr.decode(errors="replace").strip()
        raise PowerError(f"{' '.join(command)} failed (exit {exc.returncode}): {stderr}") from exc
    except subprocess.TimeoutExpired as exc:
        raise PowerError(f"{' '.join(command)} did not finish within 60 s") from exc


def _cpu_dirs(root: Path) -> list[Path]:
    base = root / CPU_DIR
    return sorted(
        (p for p in base.glob("cpu[0-9]*") if (p / "cpufreq").is_dir()),
        key=lambda p: int(p.name[3:]),
    )


def plan_power_mode(
    profile: DeviceProfile,
    mode_name: str | None,
    root: Path,
    *,
    warnings: list[str] | None = None,
) -> list[Action]:
    """The actions that put the device under ``root`` into a power mode.

    Only reads (which CPUs exist, which governors and frequencies they offer).
    With a ``warnings`` list (a dry run), what the device cannot take is said
    there and its steps left out, instead of raised.

    Raises:
        ProfileError: the profile has no such mode.
        PowerError: the device cannot take the mode (no cpufreq, a governor
            or frequency it does not offer), unless ``warnings`` is given.
    """
    cannot = _complaint(warnings)
    mode: PowerMode = profile.power_mode(mode_name)
    actions = _nvidia_actions(mode, root)
    if mode.cpu_governor is not None or mode.cpu_max_freq_khz is not None:
        cpus = _cpu_dirs(root)
        if not cpus:
            cannot(f"no CPU frequency scaling under {root / CPU_DIR} (no cpu*/cpufreq)")
        for cpu in cpus:
            actions += _cpu_actions(mode, cpu, cannot)
    return actions


def _complaint(warnings: list[str] | None) -> Callable[[str], None]:
    """How to say what the device cannot take: a :class:`PowerError` raised, or on a
    dry run (a ``warnings`` list) the message added there, so a dry run shows it all."""

    def cannot(message: str) -> None:
        if warnings is None:
            raise PowerError(message)
        warnings.append(message)

    return cannot


def _nvidia_actions(mode: PowerMode, root: Path) -> list[Action]:
    """The ``nvpmodel`` and ``jetson_clocks`` steps of ``mode``, ordered so that a mode
    never ends with the clocks of another."""
    actions: list[Action] = []
    # `jetson_clocks --restore` needs what `--store` saved before the clocks were raised.
    # Down: restore (and forget) the raised clocks first, then nvpmodel sets the new
    # mode's limits; restoring after it would bring back the higher mode's clocks. Up:
    # nvpmodel first, store its clocks (unless raised already: never store raised ones),
    # then raise them. Never raised: nothing to restore.
    saved = root / JETSON_CLOCKS_SAVED
    if mode.jetson_clocks is False and saved.exists():
        actions.append(Action(command=("jetson_clocks", "--restore", str(saved))))
        actions.append(Action(path=saved))  # removed: the clocks are the mode's again
    if mode.nvpmodel is not None:
        actions.append(Action(command=("nvpmodel", "-m", str(mode.nvpmodel))))
    if mode.jetson_clocks:
        if not saved.exists():
            actions.append(Action(command=("jetson_clocks", "--store", str(saved))))
        actions.append(Action(command=("jetson_clocks",)))
    return actions


def _cpu_actions(mode: PowerMode, cpu: Path, cannot: Callable[[str], None]) -> list[Action]:
    """The governor and frequency cap of one CPU: none at all when it does not offer the
    mode's governor (``cannot`` says so)."""
    freq = cpu / "cpufreq"
    actions: list[Action] = []
    if mode.cpu_governor is not None:
        available = freq / "scaling_available_governors"
        if available.is_file():
            offered = available.read_text().split()
            if mode.cpu_governor not in offered:
                cannot(
                    f"{cpu.name} does not offer governor {mode.cpu_governor!r} "
                    f"(it offers {', '.join(offered)})"
                )
                return []
        actions.append(Action(path=freq / "scaling_governor", value=mode.cpu_governor))
    cap = _max_freq(mode, freq)
    if cap is not None:
        actions.append(Action(path=freq / "scaling_max_freq", value=str(cap)))
    return actions


def _max_freq(mode: PowerMode, freq: Path) -> int | None:
    """The frequency cap to write: the mode's, within what the CPU offers where it says;
    with no cap in the mode, the CPU's maximum (lifting one an earlier mode, powersave,
    left behind); ``None`` when there is neither."""
    bounds = [freq / "cpuinfo_min_freq", freq / "cpuinfo_max_freq"]
    known = all(b.is_file() for b in bounds)
    low, high = (int(b.read_text().strip() or 0) for b in bounds) if known else (0, 0)
    if mode.cpu_max_freq_khz is not None:
        return max(low, min(high, mode.cpu_max_freq_khz)) if known else mode.cpu_max_freq_khz
    if known and high:
        return high
    return None


def apply_plan(actions: Sequence[Action], runner: Runner = run_command) -> None:
    """Carry out a plan.

    Raises:
        PowerError: a write was refused or a command failed (steps already
            done stay done; a power mode is re-applied whole, so this is safe).
    """
    for action in actions:
        if action.command is not None:
            runner(action.command)
        elif action.path is not None and action.value is None:
            try:
                action.path.unlink(missing_ok=True)
            except OSError as exc:
                raise PowerError(f"cannot remove {action.path}: {exc.strerror}") from exc
        elif action.path is not None and action.value is not None:
            try:
                action.path.write_text(action.value + "\n")
            except OSError as exc:
                raise PowerError(f"cannot write {action.path}: {exc.strerror}") from exc


def read_temperatures(zones: Sequence[ThermalZone], root: Path) -> dict[str, float | None]:
    """Each zone's temperature in degrees Celsius (``None`` where unreadable)."""
    temperatures: dict[str, float | None] = {}
    for zone in zones:
        try:
            temperatures[zone.name] = int((root / zone.path).read_text().strip()) / 1000.0
        except (OSError, ValueError):
            temperatures[zone.name] = None
    return temperatures
