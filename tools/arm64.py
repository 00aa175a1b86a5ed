"""Prepare an emulated 64-bit Raspberry Pi OS for ``make test-arm64`` (tests/arm64/).

Raspberry Pi OS (64-bit) is Debian bookworm for arm64, so the emulated device is a
bookworm arm64 userland run by QEMU in user mode, each piece cached under ``--cache``
in a folder named by a hash of what it depends on:

1. **the userland**: ``mmdebstrap --variant=extract`` unpacks bookworm's Python 3.11
   and the C++ and OpenMP runtimes the wheels link against (no maintainer scripts run,
   so no binfmt is needed);
2. **QEMU**: ``qemu-aarch64`` of Debian trixie's ``qemu-user`` (bookworm's QEMU 7.2
   crashes importing ONNX Runtime and LiteRT; trixie's binaries are static), fetched by
   ``apt-get download`` through a sources list and package lists of its own (the
   machine's apt is not touched) and unpacked with ``dpkg -x``;
3. **the wheels**: the device install of docs/install.md (the wheel and the extras its
   ``pip install`` line names), resolved by ``pip download --only-binary=:all:`` for a
   64-bit Raspberry Pi OS as tools/device_wheels.py names it (which tools/footprint.py
   measures too; its platform tags are checked here against those the userland's own
   pip accepts), at this machine's versions of the runtimes (so that an x86 figure and
   an aarch64 one differ by the architecture only), then installed with ``pip install
   --no-deps --target``. Nothing is compiled: a dependency without an aarch64 wheel
   fails here, by name.

The project's own wheel changes with every commit, so it is installed afresh into
``--out``, beside a wrapper interpreter (``--out``/python: the userland's
``python3.11`` under QEMU, with both folders on its path; what a unit's ``ExecStart``
or anything else that spawns an interpreter runs) and ``emulator.json``, which the
tests read. Each cached piece is built in a temporary folder and renamed into place:
an interrupted run leaves nothing half made, and checkouts can share the cache::

    python tools/arm64.py --wheel dist/edge_inference-0.3.0-py3-none-any.whl --out build/arm64
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from edge_core.errors import EdgeError
from tools.device_wheels import PLATFORMS, PYTHON, SUITE, download_for, install_for

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates", "libstdc++6", "libgomp1")
QEMU_SUITE = "trixie"  # the first whose QEMU (10.0) runs ONNX Runtime and LiteRT
QEMU_PACKAGE = "qemu-user"
# The Raspberry Pi 5's core: the kernels the runtimes pick are the ones a Pi 5 runs
# (QEMU's default CPU has SVE and SME, which no Pi has).
CPU = "cortex-a76"
# The runtimes pinned to this machine's versions, so that accuracy on x86 and on
# aarch64 is compared at the same version.
PINNED = ("numpy", "pillow", "onnxruntime", "ai-edge-litert", "opencv-python-headless")
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")

_GUIDE_PIP = re.compile(r'pip install "\./edge_inference-[^"\[]+\.whl\[([a-z0-9,_-]+)\]"')


class PrepareError(EdgeError):
    """A step cannot be done here; the message says which and why."""


def _run(command: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        list(command), capture_output=True, text=True, stdin=subprocess.DEVNULL, **kwargs
    )
    if done.returncode != 0:
        raise PrepareError(
            f"{command[0]} failed ({done.returncode}): {' '.join(command)}\n"
            f"{done.stdout[-2000:]}{done.stderr[-3000:]}"
        )
    return done


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def cached(cache: Path, name: str, build: Callable[[Path], None], log: list[str]) -> Path:
    """``cache/name``, built by ``build(folder)`` into a temporary folder first."""
    final = cache / name
    if final.is_dir():
        log.append(f"{name}: cached")
        return final
    cache.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=cache))
    try:
        build(work)
        try:
            work.rename(final)
        except OSError:
            if not final.is_dir():  # not another run's copy that won the race
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.append(f"{name}: built in {time.monotonic() - start:.0f} s")
    return final


def device_extras(guide: Path) -> str:
    """The extras of the device install in ``guide`` (docs/install.md's pip line)."""
    found = _GUIDE_PIP.search(guide.read_text(encoding="utf-8"))
    if found is None:
        raise PrepareError(f'{guide}: no `pip install "./edge_inference-...whl[...]"` line')
    return found.group(1)


def build_userland(folder: Path) -> None:
    if shutil.which("mmdebstrap") is None:
        raise PrepareError("mmdebstrap is missing: apt-get install mmdebstrap")
    root = folder / "root"
    _run(["mmdebstrap", "--quiet", "--variant=extract", "--architectures=arm64",
          f"--include={','.join(PACKAGES)}", SUITE, str(root)])  # fmt: skip


def _mirror(root: Path) -> str:
    """The Debian mirror the userland was made from (its sources.list)."""
    for line in (root / "etc/apt/sources.list").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
            return parts[1]
    raise PrepareError(f"{root}/etc/apt/sources.list names no {SUITE} mirror")


def build_qemu(folder: Path, mirror: str) -> None:
    apt = folder / "apt"
    for sub in ("lists/partial", "cache/archives/partial", "parts"):
        (apt / sub).mkdir(parents=True)
    (apt / "sources.list").write_text(f"deb [signed-by={KEYRING}] {mirror} {QEMU_SUITE} main\n")
    options = [
        "-o", f"Dir::Etc::SourceList={apt / 'sources.list'}",
        "-o", f"Dir::Etc::SourceParts={apt / 'parts'}",
        "-o", f"Dir::State::Lists={apt / 'lists'}",
        "-o", f"Dir::Cache={apt / 'cache'}",
        "-o", "APT::Sandbox::User=root",
        "-o", "Debug::NoLocking=1",
    ]  # fmt: skip
    _run(["apt-get", "-q", *options, "update"])
    _run(["apt-get", "-q", *options, "download", QEMU_PACKAGE], cwd=apt)
    (deb,) = apt.glob(f"{QEMU_PACKAGE}_*.deb")
    version = _run(["dpkg-deb", "-f", str(deb), "Version"]).stdout.strip()
    _run(["dpkg", "-x", str(deb), str(apt / "tree")])
    (apt / "tree/usr/bin/qemu-aarch64").rename(folder / "qemu-aarch64")  # the rest: 450 MB
    shutil.rmtree(apt)
    (folder / "version").write_text(version + "\n")


def emulated(qemu: Path, root: Path, *args: str) -> list[str]:
    """The command that runs the userland's Python 3.11 with ``args`` under QEMU."""
    return [str(qemu), "-cpu", CPU, "-L", str(root), str(root / "usr/bin/python3.11"), *args]


_FACTS = """
import json, platform
from pip._vendor.packaging import tags
platforms = []
for tag in tags.sys_tags():
    if tag.platform.startswith("manylinux") and tag.platform not in platforms:
        platforms.append(tag.platform)
print(json.dumps({"machine": platform.machine(), "python": platform.python_version(),
                  "platforms": platforms}))
"""


def device_facts(qemu: Path, root: Path) -> dict[str, Any]:
    """What the emulated interpreter says of itself: machine, version, platform tags.

    Raises:
        PrepareError: it is not the device tools/device_wheels.py chooses wheels for.
    """
    facts: dict[str, Any] = json.loads(_run(emulated(qemu, root, "-c", _FACTS)).stdout)
    if facts["machine"] != "aarch64":
        raise PrepareError(f"the emulated interpreter is not an aarch64 one: {facts}")
    refused = [tag for tag in PLATFORMS if tag not in facts["platforms"]]
    if refused or not facts["python"].startswith(f"{PYTHON}."):
        raise PrepareError(
            f"tools/device_wheels.py chooses wheels for CPython {PYTHON} on {PLATFORMS}; "
            f"the userland's pip is CPython {facts['python']} and refuses {refused}"
        )
    return facts


def requirements(wheel: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` lines: what its dependencies' cache depends on."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    return sorted(line for line in metadata.splitlines() if line.startswith("Requires-Dist:"))


def pinned_versions() -> dict[str, str]:
    pins = {}
    for name in PINNED:
        try:
            pins[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return pins


def build_site(folder: Path, wheel: Path, extras: str, pins: dict[str, str]) -> None:
    wheels = folder / "wheels"
    constraints = folder / "constraints.txt"
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
    downloaded = download_for(wheels, [f"{wheel}[{extras}]"], constraints=constraints)
    found = [path for path in downloaded if not path.name.startswith("edge_inference-")]
    install_for(folder / "site", [str(path) for path in found], no_deps=True)
    (folder / "wheels.txt").write_text("".join(path.name + "\n" for path in found))
    shutil.rmtree(wheels)  # installed: 110 MB that no run reads again


def write_wrapper(path: Path, qemu: Path, root: Path, paths: Sequence[Path]) -> None:
    """An interpreter a host can start: the emulated Python with the install on its path."""
    command = " ".join(f"'{part}'" for part in emulated(qemu, root))
    path.write_text(
        "#!/bin/sh\n"
        "# The aarch64 Python of an emulated Raspberry Pi OS (64-bit) userland, with the\n"
        "# agent's install on its path (tools/arm64.py wrote it).\n"
        f"export PYTHONPATH='{os.pathsep.join(str(p) for p in paths)}'\n"
        f'exec {command} "$@"\n'
    )
    path.chmod(0o755)


def prepare(wheel: Path, out: Path, cache: Path, guide: Path) -> dict[str, Any]:
    """Every piece of the emulated device, cached or made; returns what emulator.json holds.

    Raises:
        PrepareError: a tool is missing or a step failed (its output is in the message).
        EdgeError: pip found no aarch64 wheel of a dependency (it is named).
    """
    log: list[str] = []
    started = time.monotonic()
    extras = device_extras(guide)
    userland = cached(cache, f"userland-{_key(SUITE, PACKAGES)}", build_userland, log)
    root = userland / "root"
    mirror = _mirror(root)
    qemu_dir = cached(
        cache, f"qemu-{_key(QEMU_SUITE, QEMU_PACKAGE, os.uname().machine)}",
        lambda folder: build_qemu(folder, mirror), log,
    )  # fmt: skip
    qemu = qemu_dir / "qemu-aarch64"
    facts = device_facts(qemu, root)
    pins = pinned_versions()
    site_dir = cached(
        cache, f"site-{_key(requirements(wheel), extras, PLATFORMS, PYTHON, pins)}",
        lambda folder: build_site(folder, wheel, extras, pins), log,
    )  # fmt: skip
    edge = out / "edge"
    shutil.rmtree(edge, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "--quiet",
          "--no-deps", "--no-compile", "--target", str(edge), str(wheel)])  # fmt: skip
    python = out / "python"
    write_wrapper(python, qemu, root, [edge, site_dir / "site"])
    return {
        "python": str(python),
        "root": str(root),
        "qemu": str(qemu),
        "qemu_version": (qemu_dir / "version").read_text().strip(),
        "cpu": CPU,
        "suite": SUITE,
        "machine": facts["machine"],
        "python_version": facts["python"],
        "extras": extras,
        "wheel": wheel.name,
        "wheels": (site_dir / "wheels.txt").read_text().split(),
        "pinned": pins,
        "prepared": log,
        "prepare_s": round(time.monotonic() - started, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True, help="the wheel `make wheel` built")
    parser.add_argument("--out", type=Path, required=True, help="for this run's install")
    parser.add_argument(
        "--cache", type=Path, default=Path.home() / ".cache/edge-inference/arm64",
        help="the userland, QEMU and the wheels, kept between runs",
    )  # fmt: skip
    parser.add_argument("--guide", type=Path, default=ROOT / "docs/install.md")
    args = parser.parse_args(argv)
    try:
        emulator = prepare(args.wheel.resolve(), args.out.resolve(), args.cache, args.guide)
    except EdgeError as exc:  # PrepareError, or pip's
        print(f"arm64: {exc}", file=sys.stderr)
        return 1
    (args.out / "emulator.json").write_text(json.dumps(emulator, indent=2) + "\n")
    for line in emulator["prepared"]:
        print(f"arm64: {line}")
    print(
        f"arm64: {emulator['wheel']}[{emulator['extras']}] and {len(emulator['wheels'])} "
        f"aarch64 wheels on Python {emulator['python_version']} ({SUITE} arm64), QEMU "
        f"{emulator['qemu_version']} as a {CPU}: {args.out / 'python'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
