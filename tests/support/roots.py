"""Fake filesystem roots (``/proc``, ``/sys``, ``/etc``) for detection, power control
and temperatures."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["ARM_CPUINFO", "X86_CPUINFO", "make_root"]

ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU part\t: 0xd0b

processor\t: 1
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU part\t: 0xd0b
"""

X86_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512bw avx512_vnni
"""


def make_root(
    base: Path,
    *,
    model: str | None = None,
    compatible: Sequence[str] = (),
    tegra: str | None = None,
    cpuinfo: str = ARM_CPUINFO,
    cpus: int = 0,
    governors: str = "conservative ondemand userspace powersave performance schedutil",
    temperatures: dict[int, int] | None = None,
) -> Path:
    """A fake filesystem root with the files detection and power control read."""
    (base / "proc").mkdir(parents=True, exist_ok=True)
    (base / "proc/cpuinfo").write_text(cpuinfo)
    (base / "proc/meminfo").write_text("MemTotal:        8000000 kB\n")
    if model is not None or compatible:
        tree = base / "proc/device-tree"
        tree.mkdir(parents=True, exist_ok=True)
        if model is not None:
            (tree / "model").write_bytes(model.encode() + b"\x00")
        if compatible:
            (tree / "compatible").write_bytes(
                b"\x00".join(c.encode() for c in compatible) + b"\x00"
            )
    if tegra is not None:
        (base / "etc").mkdir(exist_ok=True)
        (base / "etc/nv_tegra_release").write_text(tegra)
    for index in range(cpus):
        freq = base / f"sys/devices/system/cpu/cpu{index}/cpufreq"
        freq.mkdir(parents=True)
        (freq / "scaling_governor").write_text("ondemand\n")
        (freq / "scaling_available_governors").write_text(governors + "\n")
        (freq / "cpuinfo_min_freq").write_text("600000\n")
        (freq / "cpuinfo_max_freq").write_text("2400000\n")
        (freq / "scaling_max_freq").write_text("2400000\n")
    for zone, millidegrees in (temperatures or {}).items():
        path = base / f"sys/class/thermal/thermal_zone{zone}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "temp").write_text(f"{millidegrees}\n")
    return base
