"""The thermal and power control loop: step the power mode down when hot, back up when cool.

Every ``interval_s`` (:meth:`ThermalController.step`, looped by
:meth:`~ThermalController.start` in a daemon thread) the controller reads the
profile's thermal zones and decides a level:

* ``hot``: some zone is at or above its ``throttle_c``;
* ``critical``: some zone is at or above its ``critical_c``;
* ``normal``: otherwise.

A level only drops once every zone is ``hysteresis_c`` below the threshold
that raised it, so a device hovering around 80 C does not flap between modes.

While some zone reads at or above its ``throttle_c`` the power mode steps
down one mode per step (profiles list modes from the most performant to the
least) and the agent is asked once to prefer INT8 variants
(``set_precision("int8")``, if the profile runs INT8). When every zone is
below ``throttle_c - hysteresis_c`` the mode steps back up one per step
towards the home mode (the profile's default), never past it; back home, the
agent is told to return to the profile's own order (``set_precision(None)``).
Between the two thresholds the controller holds: the level stays ``hot`` (so
the policy still offloads) but the mode moves neither way.

What the controller does not know it does not act on: an unreadable zone
neither steps the mode down nor lets it step back up (it is logged once). A
profile without thermal zones leaves the loop idle.

The agent's policy reads :meth:`ThermalController.state` (pass it as the
agent's ``device_state``): it offloads when throttled and refuses local work
when critical, with the controller's hysteresis rather than the raw readings.

Applying a power mode can fail on a real device (a governor the kernel lacks,
no permission to write sysfs): the failure is logged, the mode is retried on
the next step, and the level and precision are tracked regardless.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from edge_agent.profiles.power import apply_plan, plan_power_mode, read_temperatures
from edge_agent.profiles.schema import DeviceProfile, ThermalZone
from edge_agent.profiles.state import DeviceState, Sampled, read_cpu_load, read_device_state

__all__ = ["LEVELS", "Level", "ThermalController"]

log = logging.getLogger(__name__)

Level = Literal["normal", "hot", "critical"]
LEVELS: tuple[Level, ...] = ("normal", "hot", "critical")

Listener = Callable[[dict[str, Any]], None]


def _zone_level(zone: ThermalZone, celsius: float, margin: float) -> Level:
    """The level of one zone, with both thresholds lowered by ``margin``."""
    if celsius >= zone.critical_c - margin:
        return "critical"
    if celsius >= zone.throttle_c - margin:
        return "hot"
    return "normal"


def _higher(a: Level, b: Level) -> Level:
    return a if LEVELS.index(a) >= LEVELS.index(b) else b


def _lower(a: Level, b: Level) -> Level:
    return a if LEVELS.index(a) <= LEVELS.index(b) else b


class ThermalController:
    """Keeps the device out of its critical temperature by trading speed for heat.

    Attributes read by metrics and telemetry (replaced, never mutated, so
    they can be read from other threads): ``level``, ``power_mode``,
    ``precision``, ``temperatures`` (zone name to degrees Celsius, ``None``
    where unreadable), and the counters ``steps_down``, ``steps_up`` and
    ``apply_failures``.
    """

    def __init__(
        self,
        profile: DeviceProfile,
        root: Path = Path("/"),
        *,
        apply_power_mode: Callable[[str], None] | None = None,
        set_precision: Callable[[str | None], None] | None = None,
        interval_s: float = 5.0,
        hysteresis_c: float = 5.0,
        home_mode: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``apply_power_mode(name)`` puts the device into a mode (default: plan and
        apply it under ``root``); ``set_precision`` tells the agent which precision to
        prefer (``None``: the profile's own order; default: nothing to tell, the
        choice is only recorded). ``home_mode`` is the mode to start at and return
        to (default: the profile's default mode). ``clock`` times the load's
        sampling (read at most once a second).

        Raises:
            ValueError: ``interval_s`` is not above 0 or ``hysteresis_c`` is negative.
            ProfileError: the profile has no mode ``home_mode``.
        """
        if not interval_s > 0:
            raise ValueError(f"interval_s: expected a number of seconds > 0, got {interval_s}")
        if not hysteresis_c >= 0:
            raise ValueError(f"hysteresis_c: expected degrees Celsius >= 0, got {hysteresis_c}")
        self.profile = profile
        self.root = Path(root)
        self._cpu_load = Sampled(lambda: read_cpu_load(self.root), clock=clock)
        self.interval_s = interval_s
        self.hysteresis_c = hysteresis_c
        self._apply = apply_power_mode or self._apply_plan
        self._set_precision = set_precision or (lambda precision: None)
        self._modes = [mode.name for mode in profile.power_modes]
        self._home = self._modes.index(profile.power_mode(home_mode).name)

        self.level: Level = "normal"
        self.power_mode: str = self._modes[self._home]
        self.precision: str | None = None
        self.temperatures: dict[str, float | None] = {}
        self.steps_down = 0
        self.steps_up = 0
        self.apply_failures = 0

        self._listeners: list[Listener] = []
        self._unreadable: set[str] = set()
        self._last_error: dict[str, str] = {}  # per seam: warn when the message changes
        self._step_lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the daemon wires ---------------------------------------------------------------

    @property
    def home_mode(self) -> str:
        """The mode the controller starts at and steps back up to."""
        return self._modes[self._home]

    def on_change(self, listener: Listener) -> Listener:
        """Call ``listener`` after each step that changed the level, mode or precision.

        It gets a new dict: ``level``, ``previous_level``, ``power_mode``,
        ``previous_power_mode``, ``precision``, ``zone`` (the zone hottest
        relative to its throttle temperature, or ``None``) and ``temperatures``.
        A listener that raises is logged and does not stop the loop. Returns
        ``listener``, so it can be used as a decorator.
        """
        self._listeners.append(listener)
        return listener

    def state(self) -> DeviceState:
        """The device's state for the policy (asked for on every request): the
        temperatures of the last step (read now only before the first one), the
        load (read at most once a second), and ``throttled`` and ``critical``
        from the controller's level (with its hysteresis)."""
        level = self.level
        temperatures = self.temperatures
        if not temperatures:
            return replace(
                read_device_state(self.profile, self.root),
                throttled=level in ("hot", "critical"),
                critical=level == "critical",
            )
        return DeviceState(
            throttled=level in ("hot", "critical"),
            critical=level == "critical",
            cpu_load=self._cpu_load(),
            temperatures=tuple(temperatures.items()),
        )

    # -- one iteration -------------------------------------------------------------------------

    def step(self) -> None:
        """Read the zones once and act on them (see the module's docstring)."""
        zones = self.profile.thermal_zones
        if not zones:
            return
        with self._step_lock:
            before = (self.level, self.power_mode, self.precision)
            temperatures = read_temperatures(zones, self.root)
            self.temperatures = temperatures
            unknown = self._note_unreadable(zones, temperatures)
            self.level, raw = self._decide(zones, temperatures, unknown)

            # step down on the raw reading only: a level held "hot" by the hysteresis
            # (below throttle_c, above throttle_c - hysteresis_c) holds the mode
            if raw != "normal":
                if self.precision != "int8" and "int8" in self.profile.precisions:
                    self._change_precision("int8")
                self._move(+1)
            elif self.level == "normal" and not unknown:
                self._move(-1)
                if self.power_mode == self.home_mode and self.precision is not None:
                    self._change_precision(None)

            if (self.level, self.power_mode, self.precision) != before:
                self._notify(before, zones, temperatures)

    def _decide(
        self,
        zones: tuple[ThermalZone, ...],
        temperatures: dict[str, float | None],
        unknown: bool,
    ) -> tuple[Level, Level]:
        """The controller's level and the raw level of the readings (no hysteresis)."""
        # The raw level rises at once; the level it may fall to is computed with the
        # thresholds lowered by the hysteresis, and an unknown zone lets nothing fall.
        raw: Level = "normal"
        release: Level = self.level if unknown else "normal"
        for zone in zones:
            celsius = temperatures.get(zone.name)
            if celsius is None:
                continue
            raw = _higher(raw, _zone_level(zone, celsius, 0.0))
            release = _higher(release, _zone_level(zone, celsius, self.hysteresis_c))
        return _higher(raw, _lower(self.level, release)), raw

    def _note_unreadable(
        self, zones: tuple[ThermalZone, ...], temperatures: dict[str, float | None]
    ) -> bool:
        """Log each zone once when it becomes unreadable (and when it is back)."""
        for zone in zones:
            if temperatures.get(zone.name) is None:
                if zone.name not in self._unreadable:
                    self._unreadable.add(zone.name)
                    log.warning(
                        "thermal zone %s: cannot read a temperature from %s "
                        "(expected an integer in millidegrees Celsius); ignoring it until it reads",
                        zone.name,
                        self.root / zone.path,
                    )
            elif zone.name in self._unreadable:
                self._unreadable.discard(zone.name)
                log.info("thermal zone %s: readable again", zone.name)
        return bool(self._unreadable & {zone.name for zone in zones})

    def _move(self, direction: int) -> None:
        """One mode towards the least performant (+1) or back towards home (-1); none
        past the last mode or above home."""
        index = self._modes.index(self.power_mode) + direction
        if not self._home <= index < len(self._modes):
            return
        name = self._modes[index]
        if not self._call("apply_power_mode", self._apply, name):
            self.apply_failures += 1
            return
        self.power_mode = name
        if direction > 0:
            self.steps_down += 1
        else:
            self.steps_up += 1

    def _change_precision(self, precision: str | None) -> None:
        if self._call("set_precision", self._set_precision, precision):
            self.precision = precision

    def _call(self, seam: str, function: Callable[[Any], None], argument: Any) -> bool:
        """Call a seam; a failure is logged (once per distinct message) and reported as False."""
        try:
            function(argument)
        except Exception as exc:
            message = f"{seam}({argument!r}) failed: {exc}"
            if self._last_error.get(seam) != message:
                log.warning("%s; will retry on the next step", message)
            self._last_error[seam] = message
            return False
        self._last_error.pop(seam, None)
        return True

    def _apply_plan(self, name: str) -> None:
        apply_plan(plan_power_mode(self.profile, name, self.root))

    def _notify(
        self,
        before: tuple[Level, str, str | None],
        zones: tuple[ThermalZone, ...],
        temperatures: dict[str, float | None],
    ) -> None:
        known = [z for z in zones if temperatures.get(z.name) is not None]
        hottest = max(
            known, key=lambda z: (temperatures[z.name] or 0.0) - z.throttle_c, default=None
        )
        event: dict[str, Any] = {
            "level": self.level,
            "previous_level": before[0],
            "power_mode": self.power_mode,
            "previous_power_mode": before[1],
            "precision": self.precision,
            "zone": hottest.name if hottest else None,
            "temperatures": dict(temperatures),
        }
        log.debug("thermal change: %s", event)
        for listener in list(self._listeners):
            try:
                listener(dict(event))
            except Exception:
                log.exception("a thermal on_change listener failed (the loop goes on)")

    # -- the loop ---------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run(self) -> None:
        """Step every ``interval_s`` until :meth:`stop` (blocks; :meth:`start` threads it)."""
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:
                # A thermal loop that dies leaves the device to the firmware's throttling.
                log.exception("thermal step failed; trying again in %s s", self.interval_s)
            self._stop.wait(self.interval_s)

    def start(self, *, apply: bool = False) -> None:
        """Run the loop in a daemon thread.

        The controller assumes the device is in its home mode. With ``apply`` it
        puts it there first (a failure is logged); leave it ``False`` when the
        daemon has applied the mode itself. A profile without thermal zones
        starts no thread.

        Raises:
            RuntimeError: the loop is already running.
        """
        if self.running:
            raise RuntimeError("the thermal controller is already running; stop() it first")
        if apply and not self._call("apply_power_mode", self._apply, self.home_mode):
            self.apply_failures += 1
        if not self.profile.thermal_zones:
            log.info("profile %s has no thermal zones: no thermal control", self.profile.id)
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name="thermal-controller", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """End the loop (waits for the step in progress, up to ``timeout`` seconds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._thread = None
