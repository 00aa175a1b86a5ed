"""Profiles on real boards (issue 14 §11): 32-bit Raspberry Pi OS is armv7l and gets an
armv7l profile; a profile for another architecture than the machine's is used only
with a warning; a dry run of a power mode prints its plan, what cannot be done as
warnings; the service reports the power mode it applied, not the one it wanted."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.profiles import ProfileStore, detect_profile, resolve_profile
from tests.support.daemon import start_agent
from tests.support.paths import PROFILES
from tests.support.roots import make_root

# /proc/cpuinfo of a Raspberry Pi Zero 2 W under 32-bit Raspberry Pi OS (abridged)
ARMV7_CPUINFO = """processor\t: 0
model name\t: ARMv7 Processor rev 4 (v7l)
BogoMIPS\t: 38.40
Features\t: half thumb fastmult vfp edsp neon vfpv3 tls vfpv4 idiva idivt vfpd32 lpae evtstrm crc32
CPU implementer\t: 0x41
CPU architecture: 7
CPU part\t: 0xd03

Hardware\t: BCM2835
Model\t\t: Raspberry Pi Zero 2 W Rev 1.0
"""


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("Raspberry Pi Zero 2 W Rev 1.0", "raspberry-pi-3-32bit"),
        ("Raspberry Pi 3 Model B Plus Rev 1.3", "raspberry-pi-3-32bit"),
        ("Raspberry Pi 4 Model B Rev 1.4", "raspberry-pi-4-32bit"),
        ("Some Other Board", "generic-armv7l"),
    ],
)
def test_32_bit_raspberry_pi_os_is_armv7l(tmp_path: Path, model: str, expected: str) -> None:
    root = make_root(tmp_path, model=model, cpuinfo=ARMV7_CPUINFO)
    detection = detect_profile(list(ProfileStore(PROFILES)), root)
    assert detection.facts.arch == "armv7l"
    assert detection.profile.id == expected and detection.profile.arch == "armv7l"


def test_a_cpuinfo_without_its_architecture_line_still_says_v7l(tmp_path: Path) -> None:
    cpuinfo = ARMV7_CPUINFO.replace("CPU architecture: 7\n", "")
    root = make_root(tmp_path, model="Raspberry Pi Zero 2 W Rev 1.0", cpuinfo=cpuinfo)
    assert detect_profile(list(ProfileStore(PROFILES)), root).profile.arch == "armv7l"


def test_a_profile_for_another_architecture_is_used_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import platform

    if platform.machine() != "x86_64":
        pytest.skip("the check names an aarch64 profile on an x86_64 machine")
    with caplog.at_level(logging.DEBUG):  # warned once a process, then at debug level
        profile, _ = resolve_profile("jetson-agx-orin")
    assert profile.arch == "aarch64"
    assert any(
        "jetson-agx-orin is for aarch64 devices and this machine is x86_64" in r.getMessage()
        for r in caplog.records
    )
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        resolve_profile("jetson-agx-orin", root=make_root(tmp_path))
    # a fake root is a simulated device, not this machine: nothing to warn of
    assert not any("this machine is" in r.getMessage() for r in caplog.records)


def test_a_dry_run_prints_the_plan_and_warns_of_what_would_fail(tmp_path: Path) -> None:
    root = make_root(tmp_path, model="Raspberry Pi 4 Model B Rev 1.4")  # no cpufreq
    run = subprocess.run(
        [sys.executable, "-m", "edge_agent", "profile", "apply", "raspberry-pi-4",
         "--root", str(root), "--dry-run"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "power mode 'balanced' of raspberry-pi-4" in run.stdout
    assert "warning: no CPU frequency scaling under" in run.stderr
    real = subprocess.run(
        [sys.executable, "-m", "edge_agent", "profile", "apply", "raspberry-pi-4",
         "--root", str(root)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert real.returncode == 1 and "no CPU frequency scaling" in real.stderr


@pytest.mark.slow
def test_the_service_reports_the_power_mode_it_applied(tmp_path: Path) -> None:
    """A board without cpufreq: the mode is not applied, and /metrics says "none", not
    the profile's "balanced"."""
    running = start_agent(tmp_path, cpus=0)
    try:
        running.wait_message("READY=1")
        metrics = running.get("/metrics")[1].decode()
        assert 'edge_agent_power_mode{mode="none"} 1.0' in metrics, metrics[:2000]
        assert 'edge_agent_power_mode{mode="balanced"}' not in metrics
    finally:
        running.stop()
