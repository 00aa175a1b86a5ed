"""The configuration reference (docs/reference/*.md): current, complete, exactly what
each loader accepts; and the checks that keep it so when a field is added."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from edge_core.errors import ConfigError
from edge_core.fields import Fields, Read, load_document
from tools import config_reference
from tools.config_documents import DOCUMENTS as MAKERS
from tools.config_reference import Document, collect, problems, render, tomllib

DOCUMENTS = [make() for make in MAKERS]
IDS = [document.name for document in DOCUMENTS]
TABLES = ("a table", "a list of tables")


def test_every_page_is_current_and_documents_every_field() -> None:
    references = [collect(document) for document in DOCUMENTS]
    assert problems(references) == []
    for reference in references:
        page = config_reference.PAGES / f"{reference.document.name}.md"
        assert page.read_text(encoding="utf-8") == render(reference), (
            f"{page} is stale: run python -m tools.config_reference"
        )


def test_the_agent_page_documents_model_dir_and_the_limits() -> None:
    page = (config_reference.PAGES / "agent.md").read_text(encoding="utf-8")
    assert '<a id="model_dir"></a>`model_dir`' in page
    for key in ("max_image_pixels", "max_video_frames", "max_request_rows"):
        assert f'<a id="limits.{key}"></a>`{key}`' in page


def _accepted(document: Document, table: str, tmp_path: Path) -> set[str]:
    """The fields the loader accepts in ``table``, in its own words: the list its
    refusal of an unknown field there gives."""
    data = tomllib.loads(document.example)
    here = data
    for part in filter(None, table.split(".")):
        here = here[part[:-2]][0] if part.endswith("[]") else here[part]
    here["no_such_field"] = 1
    path = tmp_path / "config.json"  # load_document reads JSON too
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ConfigError, match="no_such_field") as refused:
        document.load(path, [])
    listing = re.search(r"known fields here: ([^)]*)\)", str(refused.value))
    assert listing is not None, str(refused.value)
    return set(listing[1].split(", "))


@pytest.mark.parametrize("document", DOCUMENTS, ids=IDS)
def test_each_table_lists_exactly_the_fields_its_loader_accepts(
    document: Document, tmp_path: Path
) -> None:
    path = tmp_path / document.file
    path.write_text(document.example, encoding="utf-8")
    reads: list[Read] = []
    document.load(path, reads)
    for section in collect(document).sections:
        subtables = {
            read.key
            for read in reads
            if re.sub(r"\[\d+\]", "[]", read.table) == section.table and read.expected in TABLES
        }
        listed = {row.key for row in section.rows}
        assert _accepted(document, section.table, tmp_path) - subtables == listed, section.table


# -- the checks, on a file of their own ------------------------------------------


@dataclass(frozen=True)
class ToySettings:
    """A toy file.

    Attributes:
        documented: a field with its description.
        mode ("fast" or "slow"): read unchecked, so its type is given here.
    """

    documented: int = 1


def _toy(loader_keys: list[str], doc: type = ToySettings) -> Document:
    def load(path: Path, reads: list[Read]) -> object:
        fields = Fields(load_document(path), path=path, reads=reads)
        for key in loader_keys:
            if key == "mode":
                fields.raw("mode", "fast")
            else:
                fields.integer(key, 1, minimum=0)
        fields.done()
        return None

    return Document(
        name="toy",
        title="Toy",
        file="toy.toml",
        intro="A toy.",
        root=doc,
        load=load,
        example="documented = 2\n",
    )


def test_the_toy_file_is_documented() -> None:
    reference = collect(_toy(["documented", "mode"]))
    assert problems([reference]) == []
    assert [(r.key, r.kind, r.default) for r in reference.sections[0].rows] == [
        ("documented", "an integer >= 0", "`1`"),
        ("mode", '"fast" or "slow"', '`"fast"`'),
    ]


def test_a_field_the_loader_reads_without_a_description_fails() -> None:
    found = problems([collect(_toy(["documented", "mode", "added"]))])
    assert found == [
        "docs/reference/toy.md: `added`: no description: add an entry `added: ...` "
        f"to the Attributes of {__name__}.ToySettings"
    ]


def test_an_entry_naming_no_field_fails() -> None:
    found = problems([collect(_toy(["documented"]))])
    assert found == [
        f"{__name__}.ToySettings: entry 'mode' names no field the loader reads: "
        "remove it, or correct its name"
    ]


@dataclass(frozen=True)
class UntypedSettings:
    """A toy file whose unchecked field says nothing of its type.

    Attributes:
        documented (an integer): typed twice.
        mode: read unchecked.
        other (default: 7): a value typed by hand.
    """


def test_types_and_defaults_come_from_the_loader_where_it_states_them() -> None:
    found = problems([collect(_toy(["documented", "mode", "other"], UntypedSettings))])
    assert len(found) == 3, found
    assert "`documented`: the loader expects an integer >= 0; the entry's type" in found[0]
    assert "`mode`: read unchecked or only asked about: state its type" in found[1]
    assert "`other`: default 7 is typed by hand" in found[2]


def test_a_check_fails_a_stale_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert config_reference.main(["--out", str(tmp_path)]) == 0
    assert config_reference.main(["--check", "--out", str(tmp_path)]) == 0
    page = tmp_path / "agent.md"
    page.write_text(page.read_text(encoding="utf-8") + "edited by hand\n", encoding="utf-8")
    assert config_reference.main(["--check", "--out", str(tmp_path)]) == 1
    assert f"{page}: stale" in capsys.readouterr().err
