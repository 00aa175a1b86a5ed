from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.profiles import (
    PowerError,
    ProfileStore,
    apply_plan,
    plan_power_mode,
    read_temperatures,
)
from tests.support.roots import make_root


def governors(root: Path) -> list[str]:
    return [
        (root / f"sys/devices/system/cpu/cpu{i}/cpufreq/scaling_governor").read_text().strip()
        for i in range(4)
    ]


def test_governor_is_written_for_every_cpu(profiles: ProfileStore, tmp_path: Path) -> None:
    root = make_root(tmp_path, cpus=4)
    plan = plan_power_mode(profiles.get("raspberry-pi-5"), "performance", root)
    assert len(plan) == 8  # each CPU: its governor, and the cap lifted to its maximum
    assert governors(root) == ["ondemand"] * 4  # planning writes nothing
    apply_plan(plan)
    assert governors(root) == ["performance"] * 4


def test_max_frequency_is_clamped_to_what_the_cpu_offers(
    profiles: ProfileStore, tmp_path: Path
) -> None:
    root = make_root(tmp_path, cpus=2)
    apply_plan(plan_power_mode(profiles.get("raspberry-pi-4"), "powersave", root))
    freq = root / "sys/devices/system/cpu/cpu1/cpufreq"
    assert (freq / "scaling_max_freq").read_text().strip() == "1000000"
    assert (freq / "scaling_governor").read_text().strip() == "ondemand"


def test_a_governor_the_kernel_lacks_is_refused(profiles: ProfileStore, tmp_path: Path) -> None:
    root = make_root(tmp_path, cpus=2, governors="ondemand powersave")
    with pytest.raises(
        PowerError,
        match="cpu0 does not offer governor 'performance' \\(it offers ondemand, powersave\\)",
    ):
        plan_power_mode(profiles.get("raspberry-pi-5"), "performance", root)


def test_no_cpufreq_is_a_clear_error(profiles: ProfileStore, tmp_path: Path) -> None:
    root = make_root(tmp_path)
    with pytest.raises(PowerError, match="no CPU frequency scaling under"):
        plan_power_mode(profiles.get("raspberry-pi-5"), None, root)


def test_jetson_modes_run_nvpmodel_and_jetson_clocks(
    profiles: ProfileStore, tmp_path: Path
) -> None:
    ran: list[tuple[str, ...]] = []
    profile = profiles.get("jetson-agx-orin")
    apply_plan(plan_power_mode(profile, "maxn", tmp_path), runner=lambda c: ran.append(tuple(c)))
    apply_plan(plan_power_mode(profile, "15w", tmp_path), runner=lambda c: ran.append(tuple(c)))
    saved = str(tmp_path / "var/lib/nvpmodel/edge-agent-clocks.conf")
    assert ran == [
        ("nvpmodel", "-m", "0"),
        ("jetson_clocks", "--store", saved),  # what --restore will need
        ("jetson_clocks",),
        ("nvpmodel", "-m", "1"),  # the clocks were never stored (this runner is a fake)
    ]
    # once stored: going down restores them before nvpmodel sets the lower mode (after
    # it, the restore would bring back the higher mode's clocks) and forgets them;
    # going up stores the mode's own clocks again
    Path(saved).parent.mkdir(parents=True)
    Path(saved).write_text("stored clocks\n")
    ran.clear()
    apply_plan(plan_power_mode(profile, "maxn", tmp_path), runner=lambda c: ran.append(tuple(c)))
    assert ran == [("nvpmodel", "-m", "0"), ("jetson_clocks",)]  # raised already: not stored
    ran.clear()
    apply_plan(plan_power_mode(profile, "15w", tmp_path), runner=lambda c: ran.append(tuple(c)))
    assert ran == [("jetson_clocks", "--restore", saved), ("nvpmodel", "-m", "1")]
    assert not Path(saved).exists()
    ran.clear()
    apply_plan(plan_power_mode(profile, "maxn", tmp_path), runner=lambda c: ran.append(tuple(c)))
    assert ran == [("nvpmodel", "-m", "0"), ("jetson_clocks", "--store", saved), ("jetson_clocks",)]


def test_missing_nvpmodel_is_reported(profiles: ProfileStore, tmp_path: Path) -> None:
    plan = plan_power_mode(profiles.get("jetson-orin-nano"), "7w", tmp_path)
    with pytest.raises(PowerError, match="nvpmodel is not installed"):
        apply_plan(plan)


def test_generic_profile_leaves_power_alone(profiles: ProfileStore, tmp_path: Path) -> None:
    assert plan_power_mode(profiles.get("generic-arm64"), None, tmp_path) == []


def test_temperatures_are_read_in_celsius(profiles: ProfileStore, tmp_path: Path) -> None:
    profile = profiles.get("jetson-orin-nano")
    root = make_root(tmp_path, temperatures={0: 54250})
    assert read_temperatures(profile.thermal_zones, root) == {"cpu": 54.25, "gpu": None}
