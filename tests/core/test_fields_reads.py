"""A ``reads`` list given to :class:`Fields` notes each field a loader asks for, with
what its error would say was expected and the default it takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.config import load_agent_config
from edge_core.errors import ConfigError
from edge_core.fields import Fields, Read


def test_a_read_notes_what_its_error_says_was_expected() -> None:
    reads: list[Read] = []
    fields = Fields({"api": {"port": 0}}, path=Path("agent.toml"), reads=reads)
    api = fields.table("api", None)
    with pytest.raises(ConfigError, match="expected an integer >= 1 and <= 65535, got 0"):
        api.integer("port", 8080, minimum=1, maximum=65535)
    assert reads == [
        Read("", "api", "a table", None, False),
        Read("api", "port", "an integer >= 1 and <= 65535", 8080, False),
    ]


def test_tables_of_an_array_asked_keys_and_required_ones_are_noted() -> None:
    reads: list[Read] = []
    fields = Fields({"streams": [{"name": "door"}]}, reads=reads)
    assert fields.has("gateway") is False
    for stream in fields.tables("streams", []):
        stream.string("name")
        stream.raw("source", None)
    assert reads == [
        Read("", "gateway", None, None, False),
        Read("", "streams", "a list of tables", [], False),
        Read("streams[0]", "name", "a string", None, True),
        Read("streams[0]", "source", None, None, False),
    ]


def test_without_a_list_nothing_is_noted_and_the_agent_loads_the_same(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('device_id = "cam-01"\n[limits]\nmax_request_rows = 8\n')
    reads: list[Read] = []
    assert load_agent_config(path, reads=reads) == load_agent_config(path)
    noted = {(read.table, read.key) for read in reads}
    assert {("", "device_id"), ("", "limits"), ("limits", "max_request_rows")} <= noted
