"""The layout map of docs/development.md names what the packages hold: every module
and subpackage of each is on the map, and every line of the map that begins with a
name begins with one that exists. A module added or moved without the map fails
here."""

from __future__ import annotations

import functools
import re
import subprocess

import pytest

from tests.support.paths import ROOT

PACKAGES = ("edge_core", "edge_agent", "cloud_gateway", "benchmarks")
NAME = re.compile(r"\b[a-z_0-9]+(?:\.py|/)")


def the_map() -> dict[str, list[str]]:
    """Each package's lines of the map (its own line and those below it)."""
    text = (ROOT / "docs" / "development.md").read_text()
    section = text[text.index("## Layout") :]
    block = section[section.index("```") + 3 :]
    block = block[: block.index("```")]
    lines: dict[str, list[str]] = {}
    current = None
    for line in block.splitlines():
        if line and not line.startswith(" "):
            current = line.split()[0].rstrip("/")
            lines[current] = []
        elif current is not None:
            lines[current].append(line)
    return lines


@functools.cache
def tracked(package: str) -> tuple[str, ...]:
    """The paths inside ``package`` that git tracks (``package/`` left out)."""
    files = subprocess.run(
        ["git", "ls-files", package], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return tuple(path.split("/", 1)[1] for path in files)


def children(package: str) -> set[str]:
    """What git tracks directly in ``package``: modules as ``name.py``, folders as
    ``name/`` (not ``__init__.py``, ``__main__.py`` or data files)."""
    found = set()
    for path in tracked(package):
        parts = path.split("/")
        if len(parts) > 1:
            found.add(parts[0] + "/")
        elif parts[0].endswith(".py") and parts[0] not in ("__init__.py", "__main__.py"):
            found.add(parts[0])
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_of_a_package_is_on_the_map(package: str) -> None:
    named = {name for line in the_map()[package] for name in NAME.findall(line)}
    assert not children(package) - named, (
        f"not on the map in docs/development.md: {sorted(children(package) - named)}"
    )


def everything(package: str) -> set[str]:
    """Every module and folder git tracks in ``package``, at any depth, by name."""
    names = set()
    for path in tracked(package):
        parts = path.split("/")
        names.update(part + "/" for part in parts[:-1])
        names.add(parts[-1])
    return names


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_on_the_map_exists(package: str) -> None:
    """A name that begins a line is one of the package's own; any other (a module a
    folder's line names) is somewhere in it."""
    lines = [line for line in the_map()[package] if line.strip()]
    first = {
        m.group(0)
        for line in lines
        if (m := NAME.match(line.strip())) and line.startswith("  ") and not line.startswith("   ")
    }
    assert not first - children(package), f"not in {package}: {sorted(first - children(package))}"
    named = {name for line in lines for name in NAME.findall(line)}
    assert not named - everything(package), (
        f"not in {package}: {sorted(named - everything(package))}"
    )
