"""32-bit ARM: why the agent cannot run there, said before anything imports NumPy.

The package registry has no 32-bit ARM wheels of NumPy, Pillow, ONNX Runtime, LiteRT
or OpenCV, so ``pyproject.toml``'s environment markers leave every dependency with
compiled code out of an install on ``armv7l`` and ``armv6l`` (Raspberry Pi OS 32-bit)
rather than have pip compile them for an hour and fail. What is installed then cannot
run, and every ``edge-agent`` command says so at once, with what does: a 64-bit OS on
the same board. An interpreter the markers cannot tell apart (a 32-bit one under a
64-bit kernel reports ``aarch64``, or ``armv8l``) is told the same by its pointer size.
A 32-bit device that has NumPy all the same (built elsewhere, e.g. piwheels) is let
through: its armv7l profiles (``raspberry-pi-4-32bit``, ...) run what it has installed.
"""

from __future__ import annotations

import importlib.util
import platform
import struct

__all__ = ["ARM32_MACHINES", "arm32_refusal", "arm32_refusal_here"]

#: what ``platform.machine()`` reports on a 32-bit ARM kernel, or a 32-bit personality
ARM32_MACHINES = ("armv6l", "armv7l", "armv8l")
_ARM64_MACHINES = ("aarch64", "arm64")


def arm32_refusal(machine: str, pointer_bytes: int, has_numpy: bool) -> str | None:
    """Why the agent cannot run on this interpreter (``machine`` as ``platform.machine()``
    says it, its pointers' size), or ``None`` where it can."""
    lowered = machine.lower()
    arm32 = lowered in ARM32_MACHINES or (lowered in _ARM64_MACHINES and pointer_bytes == 4)
    if not arm32 or has_numpy:
        return None
    what = lowered if lowered in ARM32_MACHINES else f"a 32-bit interpreter on {lowered}"
    return (
        f"this is a 32-bit ARM system ({what}) and the agent cannot run on it: the package "
        "registry has no 32-bit ARM wheels of NumPy, ONNX Runtime or LiteRT, so they were "
        "not installed. A 64-bit OS on the same board runs it: Raspberry Pi OS (64-bit) on "
        "a Raspberry Pi 3, 4, 5 or Zero 2 W (docs/install.md); a Pi 1, Zero or Zero W has "
        "no 64-bit CPU"
    )


def arm32_refusal_here() -> str | None:
    """:func:`arm32_refusal` for the running interpreter."""
    has_numpy = importlib.util.find_spec("numpy") is not None
    return arm32_refusal(platform.machine(), struct.calcsize("P"), has_numpy)
