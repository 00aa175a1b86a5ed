"""One version, said the same everywhere: the wheel's, the commands', the servers'."""

from __future__ import annotations

import importlib.metadata

import pytest

from cloud_gateway.cli import main as gateway_main
from cloud_gateway.dataplane import SERVER_VERSION
from edge_agent.cli import main as agent_main
from edge_agent.service.http_api import SERVER
from edge_core import __version__
from tests.support.paths import ROOT


def test_the_installed_distribution_has_the_packages_version() -> None:
    assert importlib.metadata.version("edge-inference") == __version__


@pytest.mark.parametrize(
    ("main", "prog"), [(agent_main, "edge-agent"), (gateway_main, "cloud-gateway")]
)
def test_both_commands_say_the_version(main, prog, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"{prog} {__version__}"


def test_the_servers_metadata_says_the_version() -> None:
    assert SERVER["version"] == SERVER_VERSION == __version__


def test_the_changelogs_newest_release_is_this_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    releases = [line for line in text.splitlines() if line.startswith("## ")]
    assert releases[0].startswith(f"## {__version__} "), releases[0]
