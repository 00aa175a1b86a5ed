"""The wheels a 64-bit Raspberry Pi OS installs, chosen from this machine by
``pip --platform``: tools/footprint.py measures them (``--aarch64``), tools/arm64.py
runs them under QEMU (``make test-arm64``).

Raspberry Pi OS (64-bit) is Debian bookworm for arm64: glibc 2.36 and CPython 3.11.
pip does not widen a ``--platform`` to the older manylinux tags itself, so every tag
that glibc takes is named (:data:`PLATFORMS`); tools/arm64.py checks them against the
tags the emulated userland's own pip accepts, so CI proves them. ``--only-binary``:
nothing is built here, and a dependency with no aarch64 wheel fails, by name, as pip
on the device would fail in a compiler.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from edge_core.errors import EdgeError

__all__ = ["PLATFORMS", "PYTHON", "SUITE", "download_for", "install_for", "pip", "platform_options"]

SUITE = "bookworm"  # what Raspberry Pi OS (64-bit) is built on
PYTHON = "3.11"  # bookworm's python3
# glibc 2.36 takes every manylinux wheel up to 2_36; aarch64's begin at 2_17 (2014)
PLATFORMS = (
    *(f"manylinux_2_{minor}_aarch64" for minor in range(36, 16, -1)),
    "manylinux2014_aarch64",
)


def platform_options(platforms: Sequence[str] = PLATFORMS, python: str = PYTHON) -> list[str]:
    """pip's options that choose wheels for CPython ``python`` on ``platforms``."""
    version = python.replace(".", "")
    options = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp",
               "--abi", f"cp{version}"]  # fmt: skip
    for platform in platforms:
        options += ["--platform", platform]
    return options


def install_for(
    folder: Path, requirements: Sequence[str], *, no_deps: bool = False,
    constraints: Path | None = None,
) -> Path:  # fmt: skip
    """``requirements`` as pip on the device would install them, into ``folder``
    (``--target``): what that device holds, not run here.

    Raises:
        EdgeError: pip failed (a dependency with no wheel for the device).
    """
    extra = (["--no-deps"] if no_deps else []) + _constrained(constraints)
    pip("install", "--target", str(folder), *extra, *platform_options(), *requirements)
    return folder


def download_for(
    folder: Path, requirements: Sequence[str], *, constraints: Path | None = None
) -> list[Path]:
    """The device's wheels of ``requirements`` and their dependencies, into ``folder``.

    Raises:
        EdgeError: pip failed (a dependency with no wheel for the device).
    """
    pip("download", "--dest", str(folder), *_constrained(constraints), *platform_options(),
         *requirements)  # fmt: skip
    return sorted(folder.glob("*.whl"))


def _constrained(constraints: Path | None) -> list[str]:
    return [] if constraints is None else ["--constraint", str(constraints)]


def pip(*args: str) -> None:
    """This interpreter's ``pip ARGS``, quietly.

    Raises:
        EdgeError: it failed; the message ends with what it said.
    """
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *args],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise EdgeError(f"pip {' '.join(args[:2])} failed: {done.stderr[-3000:]}")
