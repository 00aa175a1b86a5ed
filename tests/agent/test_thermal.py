"""The thermal control loop on a fake sysfs root: real cpufreq files, real temperature files."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_agent.agent import Agent
from edge_agent.policy.rules import PolicyRules
from edge_agent.profiles import DeviceProfile, ProfileStore
from edge_agent.profiles.state import read_device_state
from edge_agent.service.thermal import ThermalController
from edge_core.errors import ProfileError
from edge_core.repository import ModelRepository
from tests.support.paths import MODELS
from tests.support.roots import make_root
from tests.support.waiting import wait_for

ZONE = "sys/class/thermal/thermal_zone0/temp"


@pytest.fixture
def pi5(profiles: ProfileStore) -> DeviceProfile:
    return profiles.get("raspberry-pi-5")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_root(tmp_path, cpus=2, temperatures={0: 50000})


def heat(root: Path, celsius: float) -> None:
    (root / ZONE).write_text(f"{round(celsius * 1000)}\n")


def cpufreq(root: Path) -> list[tuple[str, str]]:
    """(scaling_governor, scaling_max_freq) of each fake CPU."""
    result = []
    for cpu in range(2):
        freq = root / f"sys/devices/system/cpu/cpu{cpu}/cpufreq"
        result.append(
            (
                (freq / "scaling_governor").read_text().strip(),
                (freq / "scaling_max_freq").read_text().strip(),
            )
        )
    return result


class Precisions:
    """The agent's side of ``set_precision``: what it was told, in order."""

    def __init__(self) -> None:
        self.calls: list[str | None] = []

    def __call__(self, precision: str | None) -> None:
        self.calls.append(precision)


def controller(
    profile: DeviceProfile, root: Path, precisions: Precisions, **kwargs: Any
) -> ThermalController:
    return ThermalController(profile, root, set_precision=precisions, **kwargs)


def test_normal_temperatures_change_nothing(pi5: DeviceProfile, root: Path) -> None:
    precisions = Precisions()
    thermal = controller(pi5, root, precisions)
    events: list[dict[str, Any]] = []
    thermal.on_change(events.append)
    for celsius in (50.0, 50.0, 78.0):  # 78 C: below throttle, and rising does not use hysteresis
        heat(root, celsius)
        thermal.step()
    assert thermal.level == "normal"
    assert thermal.power_mode == "balanced"
    assert thermal.temperatures == {"cpu": 78.0}
    assert (thermal.steps_down, thermal.steps_up, thermal.precision) == (0, 0, None)
    assert precisions.calls == []
    assert events == []
    assert cpufreq(root) == [("ondemand", "2400000")] * 2
    assert not thermal.state().throttled


def test_hot_steps_down_to_the_last_mode_and_prefers_int8_once(
    pi5: DeviceProfile, root: Path
) -> None:
    precisions = Precisions()
    thermal = controller(pi5, root, precisions)
    heat(root, 82.0)
    thermal.step()
    assert thermal.level == "hot"
    assert thermal.power_mode == "powersave"
    assert thermal.steps_down == 1
    assert precisions.calls == ["int8"]
    assert thermal.precision == "int8"
    # the default seam really planned and applied the mode under the root
    assert cpufreq(root) == [("ondemand", "1500000")] * 2
    state = thermal.state()
    assert (state.throttled, state.critical) == (True, False)

    thermal.step()  # still hot, already at the last mode: nothing more to give
    assert thermal.power_mode == "powersave"
    assert thermal.steps_down == 1
    assert precisions.calls == ["int8"]


def test_a_full_heat_cycle_with_hysteresis(pi5: DeviceProfile, root: Path) -> None:
    precisions = Precisions()
    thermal = controller(pi5, root, precisions)
    heat(root, 82.0)
    thermal.step()

    heat(root, 86.0)
    thermal.step()
    assert thermal.level == "critical"
    (root / "proc/loadavg").write_text("1.50 1.00 0.50 1/100 123\n")
    state = thermal.state()
    assert (state.throttled, state.critical) == (True, True)
    assert dict(state.temperatures) == {"cpu": 86.0}
    assert state.cpu_load == pytest.approx(1.5 / (os.cpu_count() or 1))  # as read_device_state

    heat(root, 78.0)  # below throttle (80) but within the 5 C hysteresis: hold
    thermal.step()
    assert thermal.level == "hot"
    assert thermal.power_mode == "powersave"
    assert (thermal.state().throttled, thermal.state().critical) == (True, False)
    assert not read_device_state(pi5, root).throttled  # the raw reading would have let go
    assert precisions.calls == ["int8"]
    assert thermal.steps_up == 0

    heat(root, 70.0)
    thermal.step()
    assert thermal.level == "normal"
    assert thermal.power_mode == "balanced"
    assert thermal.steps_up == 1
    assert precisions.calls == ["int8", None]
    assert thermal.precision is None
    assert not thermal.state().throttled
    assert [governor for governor, _ in cpufreq(root)] == ["ondemand"] * 2

    thermal.step()  # cool, at the default: never past it to performance
    assert thermal.power_mode == "balanced"
    assert thermal.steps_up == 1
    assert precisions.calls == ["int8", None]


def test_modes_move_one_per_step_down_and_back_up_to_home(pi5: DeviceProfile, root: Path) -> None:
    thermal = controller(pi5, root, Precisions(), home_mode="performance")
    assert thermal.power_mode == "performance"
    heat(root, 82.0)
    modes = []
    for _ in range(3):
        thermal.step()
        modes.append(thermal.power_mode)
    assert modes == ["balanced", "powersave", "powersave"]
    heat(root, 70.0)
    for _ in range(3):
        thermal.step()
        modes.append(thermal.power_mode)
    assert modes[3:] == ["balanced", "performance", "performance"]
    assert (thermal.steps_down, thermal.steps_up) == (2, 2)
    assert [governor for governor, _ in cpufreq(root)] == ["performance"] * 2


def test_within_the_hysteresis_band_the_mode_holds(pi5: DeviceProfile, root: Path) -> None:
    precisions = Precisions()
    thermal = controller(pi5, root, precisions, home_mode="performance")
    heat(root, 82.0)  # above the 80 C throttle: one step down
    thermal.step()
    assert (thermal.level, thermal.power_mode, thermal.steps_down) == ("hot", "balanced", 1)
    for celsius in (78.0, 78.0, 75.5):  # below throttle, above throttle - hysteresis (75)
        heat(root, celsius)
        thermal.step()
        assert (thermal.level, thermal.power_mode) == ("hot", "balanced"), celsius
        assert (thermal.steps_down, thermal.steps_up) == (1, 0)
        assert thermal.state().throttled  # the policy still offloads meanwhile
    assert cpufreq(root) == [("ondemand", "2400000")] * 2  # balanced, not powersave
    heat(root, 74.0)  # below the band: back up
    thermal.step()
    assert (thermal.level, thermal.power_mode, thermal.steps_up) == ("normal", "performance", 1)
    assert precisions.calls == ["int8", None]
    assert [governor for governor, _ in cpufreq(root)] == ["performance"] * 2


def test_under_heat_the_agent_switches_to_its_int8_variant(
    profiles: ProfileStore, tmp_path: Path
) -> None:
    orin = profiles.get("jetson-orin-nano")
    root = make_root(tmp_path, tegra="# R36 (release)", temperatures={0: 50000, 1: 50000})
    applied: list[str] = []
    agent: Agent
    thermal = ThermalController(
        orin,
        root,
        apply_power_mode=applied.append,  # nvpmodel is not in a fake root
        set_precision=lambda precision: agent.prefer_precision(precision),
    )
    agent = Agent(
        profile=orin,
        repository=ModelRepository(MODELS),
        rules=PolicyRules(),
        device_state=thermal.state,
    )
    try:
        agent.local_model("digits-light")
        assert agent.loaded()["digits-light"]["variant"] == "onnx-fp16"
        x = ModelRepository(MODELS).get("digits-light").evaluation()[0][:2].astype(np.float32)
        (root / "sys/class/thermal/thermal_zone1/temp").write_text("87000\n")  # the GPU
        thermal.step()
        assert (thermal.level, thermal.precision, applied) == ("hot", "int8", ["7w"])
        assert agent.loaded()["digits-light"]["variant"] == "onnx-int8"
        result = agent.local_model("digits-light").session.run({"pixels": x})
        assert result["probabilities"].shape == (2, 10)
        (root / "sys/class/thermal/thermal_zone1/temp").write_text("60000\n")
        thermal.step()
        assert (thermal.level, thermal.precision, applied) == ("normal", None, ["7w", "15w"])
        assert agent.loaded()["digits-light"]["variant"] == "onnx-fp16"
    finally:
        agent.close()


def test_stepping_back_up_lifts_the_powersave_frequency_cap(pi5: DeviceProfile, root: Path) -> None:
    thermal = controller(pi5, root, Precisions())
    heat(root, 82.0)
    thermal.step()
    heat(root, 70.0)
    thermal.step()
    assert thermal.power_mode == "balanced"
    assert cpufreq(root) == [("ondemand", "2400000")] * 2


def test_an_unreadable_zone_neither_steps_down_nor_lets_go(
    pi5: DeviceProfile, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    precisions = Precisions()
    thermal = controller(pi5, root, precisions)
    with caplog.at_level(logging.WARNING, logger="edge_agent.service.thermal"):
        (root / ZONE).write_text("not a number\n")
        thermal.step()
        (root / ZONE).unlink()
        thermal.step()
    assert thermal.temperatures == {"cpu": None}
    assert (thermal.level, thermal.power_mode, thermal.steps_down) == ("normal", "balanced", 0)
    assert precisions.calls == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # logged once, not every step
    assert "thermal zone cpu" in warnings[0]
    assert str(root / ZONE) in warnings[0]

    heat(root, 82.0)  # readable again, and hot
    thermal.step()
    assert thermal.power_mode == "powersave"

    (root / ZONE).unlink()  # unknown while stepped down: hold, do not step back up
    thermal.step()
    thermal.step()
    assert (thermal.level, thermal.power_mode, thermal.steps_up) == ("hot", "powersave", 0)
    assert precisions.calls == ["int8"]

    heat(root, 70.0)
    thermal.step()
    assert (thermal.level, thermal.power_mode) == ("normal", "balanced")


def test_apply_errors_are_logged_and_the_level_is_still_tracked(
    pi5: DeviceProfile, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # a kernel without the ondemand governor: the default seam raises a real PowerError
    root = make_root(tmp_path, cpus=2, temperatures={0: 50000}, governors="performance powersave")
    precisions = Precisions()
    thermal = controller(pi5, root, precisions)
    heat(root, 86.0)
    with caplog.at_level(logging.WARNING, logger="edge_agent.service.thermal"):
        thermal.step()
        thermal.step()
    assert thermal.level == "critical"
    assert thermal.state().critical
    assert precisions.calls == ["int8"]
    assert thermal.power_mode == "balanced"  # it did not get there: not claimed
    assert (thermal.apply_failures, thermal.steps_down) == (2, 0)
    assert cpufreq(root) == [("ondemand", "2400000")] * 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # the same failure is not repeated every step
    assert "apply_power_mode('powersave') failed" in warnings[0]
    assert "does not offer governor 'ondemand'" in warnings[0]

    for cpu in range(2):  # the kernel offers it now: the next step gets there
        freq = root / f"sys/devices/system/cpu/cpu{cpu}/cpufreq"
        (freq / "scaling_available_governors").write_text("ondemand performance powersave\n")
    thermal.step()
    assert thermal.power_mode == "powersave"
    assert cpufreq(root) == [("ondemand", "1500000")] * 2


def test_a_profile_without_int8_keeps_its_precision(pi5: DeviceProfile, root: Path) -> None:
    precisions = Precisions()
    thermal = controller(replace(pi5, precisions=("fp32",)), root, precisions)
    heat(root, 82.0)
    thermal.step()
    heat(root, 70.0)
    thermal.step()
    assert (thermal.steps_down, thermal.steps_up) == (1, 1)
    assert precisions.calls == []
    assert thermal.precision is None


def test_a_profile_without_thermal_zones_does_nothing(pi5: DeviceProfile, root: Path) -> None:
    applied: list[str] = []
    thermal = ThermalController(
        replace(pi5, thermal_zones=()), root, apply_power_mode=applied.append, interval_s=0.01
    )
    heat(root, 90.0)
    thermal.step()
    thermal.start()
    assert not thermal.running
    thermal.stop()
    assert (thermal.level, thermal.power_mode, thermal.temperatures) == ("normal", "balanced", {})
    assert applied == []
    assert not thermal.state().throttled


def test_on_change_reports_each_change_once(pi5: DeviceProfile, root: Path) -> None:
    thermal = controller(pi5, root, Precisions())
    events: list[dict[str, Any]] = []
    thermal.on_change(events.append)

    @thermal.on_change
    def broken(event: dict[str, Any]) -> None:
        raise RuntimeError("a listener bug")

    thermal.step()
    heat(root, 82.0)
    thermal.step()
    thermal.step()
    heat(root, 70.0)
    thermal.step()
    assert events == [
        {
            "level": "hot",
            "previous_level": "normal",
            "power_mode": "powersave",
            "previous_power_mode": "balanced",
            "precision": "int8",
            "zone": "cpu",
            "temperatures": {"cpu": 82.0},
        },
        {
            "level": "normal",
            "previous_level": "hot",
            "power_mode": "balanced",
            "previous_power_mode": "powersave",
            "precision": None,
            "zone": "cpu",
            "temperatures": {"cpu": 70.0},
        },
    ]


def test_the_background_loop_steps_on_its_interval(pi5: DeviceProfile, root: Path) -> None:
    interval = 0.02
    thermal = controller(pi5, root, Precisions(), interval_s=interval)
    thermal.start()
    try:
        assert thermal.running
        with pytest.raises(RuntimeError, match="already running"):
            thermal.start()
        heat(root, 82.0)
        # well under the 5 s default interval, with room for a busy machine
        wait_for(lambda: thermal.power_mode == "powersave", 100 * interval, interval=0.005)
        heat(root, 70.0)
        wait_for(lambda: thermal.power_mode == "balanced", 100 * interval, interval=0.005)
    finally:
        thermal.stop(timeout=5.0)
    assert not thermal.running
    heat(root, 82.0)  # stopped: nobody reacts any more
    time.sleep(5 * interval)
    assert (thermal.power_mode, thermal.steps_down) == ("balanced", 1)


def test_the_loop_goes_on_when_applying_fails(
    pi5: DeviceProfile, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    attempts: list[str] = []
    tried_thrice = threading.Event()

    def denied(mode: str) -> None:
        attempts.append(mode)
        if len(attempts) >= 3:
            tried_thrice.set()
        raise PermissionError(13, "Permission denied", "scaling_governor")

    precisions = Precisions()
    thermal = controller(pi5, root, precisions, apply_power_mode=denied, interval_s=0.01)
    heat(root, 86.0)
    with caplog.at_level(logging.WARNING, logger="edge_agent.service.thermal"):
        thermal.start()
        try:
            assert tried_thrice.wait(5.0)
            assert thermal.running
        finally:
            thermal.stop(timeout=5.0)
    assert set(attempts) == {"powersave"}
    assert thermal.level == "critical"
    assert thermal.state().critical
    assert precisions.calls == ["int8"]
    assert thermal.power_mode == "balanced"
    assert sum("Permission denied" in r.getMessage() for r in caplog.records) == 1


def test_start_can_apply_the_home_mode(pi5: DeviceProfile, root: Path) -> None:
    thermal = controller(pi5, root, Precisions(), home_mode="performance", interval_s=60.0)
    thermal.start(apply=True)
    try:
        assert cpufreq(root) == [("performance", "2400000")] * 2
    finally:
        thermal.stop(timeout=5.0)
    assert not thermal.running  # stop() does not wait out the interval


def test_bad_settings_are_refused_with_what_was_expected(pi5: DeviceProfile, root: Path) -> None:
    with pytest.raises(ValueError, match="interval_s: expected a number of seconds > 0, got 0"):
        ThermalController(pi5, root, interval_s=0)
    with pytest.raises(ValueError, match="hysteresis_c: expected degrees Celsius >= 0, got -1"):
        ThermalController(pi5, root, hysteresis_c=-1)
    with pytest.raises(ProfileError, match="no power mode 'turbo'; it has performance"):
        ThermalController(pi5, root, home_mode="turbo")


def test_readings_asked_for_on_every_request_are_sampled_at_most_once_a_second() -> None:
    from edge_agent.profiles.state import Sampled

    now = [100.0]
    reads: list[float] = []

    def read() -> float:
        reads.append(now[0])
        return now[0]

    sampled = Sampled(read, max_age_s=1.0, clock=lambda: now[0])
    assert [sampled() for _ in range(5)] == [100.0] * 5 and reads == [100.0]
    now[0] = 100.9
    assert sampled() == 100.0  # still fresh
    now[0] = 101.0
    assert sampled() == 101.0 and reads == [100.0, 101.0]


def test_the_agent_and_the_controller_read_the_load_once_a_second(
    pi5: DeviceProfile, root: Path
) -> None:
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    per_cpu = 1.0 / (os.cpu_count() or 1)
    (root / "proc/loadavg").write_text("1.00 1.00 0.50 1/100 123\n")
    thermal = ThermalController(pi5, root, set_precision=Precisions(), clock=clock)
    thermal.step()
    agent = Agent(
        profile=pi5, repository=ModelRepository(MODELS), rules=PolicyRules(), root=root,
        clock=clock,
    )  # fmt: skip
    try:
        readers = (thermal.state, agent.device_state)
        assert [read().cpu_load for read in readers] == pytest.approx([per_cpu] * 2)
        (root / "proc/loadavg").write_text("3.00 1.00 0.50 1/100 123\n")
        now[0] = 0.9  # the next requests, within the second: the load is not read again
        assert [read().cpu_load for read in readers] == pytest.approx([per_cpu] * 2)
        now[0] = 1.0
        assert [read().cpu_load for read in readers] == pytest.approx([3 * per_cpu] * 2)
    finally:
        agent.close()
