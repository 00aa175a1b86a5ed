"""32-bit ARM (Raspberry Pi OS 32-bit): an install leaves out what has no wheel there
rather than compile it, and every command says at once why the agent cannot run and
what does (a 64-bit OS on the same board)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement

from edge_agent.cli.arm32 import arm32_refusal
from tests.support.paths import ROOT
from tools.arm64 import device_extras

# what the device install may still pull on 32-bit ARM: pure Python, wheels for every arch
PURE = {"prometheus-client", "httpx", "tuf", "paho-mqtt"}


@pytest.mark.parametrize(
    ("machine", "pointer_bytes", "has_numpy", "refused"),
    [
        ("armv7l", 4, False, "(armv7l)"),
        ("armv6l", 4, False, "(armv6l)"),
        ("armv8l", 4, False, "(armv8l)"),
        ("aarch64", 4, False, "(a 32-bit interpreter on aarch64)"),  # a 64-bit kernel
        ("armv7l", 4, True, None),  # NumPy from elsewhere (piwheels): let through
        ("aarch64", 8, False, None),
        ("x86_64", 8, False, None),
    ],
)
def test_a_32_bit_arm_interpreter_without_numpy_is_told_what_runs(
    machine: str, pointer_bytes: int, has_numpy: bool, refused: str | None
) -> None:
    reason = arm32_refusal(machine, pointer_bytes, has_numpy)
    if refused is None:
        assert reason is None
        return
    assert reason is not None and refused in reason
    assert "no 32-bit ARM wheels of NumPy, ONNX Runtime or LiteRT" in reason
    assert "Raspberry Pi OS (64-bit)" in reason


def device_requirements() -> list[Requirement]:
    """The requirements of docs/install.md's device install, from pyproject.toml, the
    extras that name the project's own (``device``: ``edge-inference[litert,...]``)
    expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    extras = device_extras(ROOT / "docs" / "install.md").split(",")
    seen: set[str] = set()
    while extras:
        extra = extras.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in project["optional-dependencies"][extra]:
            requirement = Requirement(line)
            if requirement.name == project["name"]:
                extras += sorted(requirement.extras)
            else:
                wanted.append(requirement)
    return wanted


@pytest.mark.parametrize("machine", ["armv7l", "armv6l"])
def test_on_32_bit_arm_the_device_install_pulls_nothing_to_compile(machine: str) -> None:
    environment = {**default_environment(), "platform_machine": machine, "python_version": "3.11"}
    kept = {
        r.name for r in device_requirements() if r.marker is None or r.marker.evaluate(environment)
    }
    assert kept == PURE


@pytest.mark.parametrize("machine", ["aarch64", "x86_64"])
def test_on_64_bit_machines_the_device_install_pulls_everything(machine: str) -> None:
    environment = {**default_environment(), "platform_machine": machine, "python_version": "3.11"}
    left_out = {
        r.name for r in device_requirements() if r.marker and not r.marker.evaluate(environment)
    }
    assert left_out == {"tomli"}  # in the standard library from Python 3.11


def test_every_command_says_so_before_anything_imports_numpy() -> None:
    """Where the markers left NumPy out, importing it fails: the command must not."""
    code = (
        "import sys; sys.modules['numpy'] = None\n"  # as where it was not installed
        "from edge_agent.cli import main\n"
        "from edge_agent.cli.arm32 import arm32_refusal\n"
        "here = lambda: arm32_refusal('armv7l', 4, 'numpy' in sys.modules and sys.modules['numpy'] is not None)\n"
        "raise SystemExit(main(['service', 'install', '--dry-run'], refusal=here))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()  # one line, no traceback
    assert line.startswith("edge-agent: error: this is a 32-bit ARM system (armv7l)")
    assert "A 64-bit OS on the same board runs it" in line
