"""The configuration reference, ``docs/reference/*.md``, made from the code itself.

For each configuration file, its own loader reads an example that holds every
table, noting each field it asks for (:class:`edge_core.fields.Read`): what the
loader asks for is what the file accepts (``Fields.done`` refuses the rest), with
what it expects, in the words its errors use, and the default it takes. Each
field's description is the entry of its name in the ``Attributes:`` section of the
settings class that holds its table (a class's field of the table's name, or one
a document names): ``name: what it does``, ``name (default: prose): ...`` where
the default depends on something else, ``name (a type): ...`` where the loader
reads the value unchecked. A table with no class of its own (``[metrics]``) is
documented in its parent's class as ``table.field``. So the loader, the defaults
and the descriptions stay in the code, and a field is documented by one line
beside the settings it fills::

    python -m tools.config_reference            # rewrite the pages
    python -m tools.config_reference --check    # fail when one is stale, or a field,
                                                # a table or an entry is amiss (make docs)

``--check`` fails on a field without a description, an entry that names no
field, an unchecked field without a type, a default typed by hand as a value
(values come from the loader), and a table the example leaves out.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import sys
import tempfile
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_core.errors import ConfigError
from edge_core.fields import Read

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "Document",
    "Entry",
    "Reference",
    "collect",
    "entries",
    "main",
    "problems",
    "render",
]

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "reference"

_ENTRY = re.compile(r"(?P<name>[A-Za-z0-9_.]+)(?: \((?P<paren>[^)]*)\))?: (?P<text>.*)")
_INDEX = re.compile(r"\[\d+\]")
_TABLE_KINDS = ("a table", "a list of tables")


@dataclass(frozen=True)
class Entry:
    """One entry of a settings class's ``Attributes:`` section."""

    owner: type
    name: str
    text: str
    type: str | None = None  # what the value is, for a field the loader reads unchecked
    default: str | None = None  # prose, for a default that depends on something else


@dataclass(frozen=True)
class Document:
    """One configuration file: how it is loaded, and which classes document it.

    ``load`` reads a file noting each field it asks for in the list it is given.
    ``example`` holds every table (it is loaded, so it is valid, and shown).
    ``classes`` names the class of a table when no field of its parent's class
    has its name (``None``: its parent documents it); ``like`` a table whose
    fields are another table's.
    """

    name: str  # the page, docs/reference/<name>.md
    title: str
    file: str  # the example's file name
    intro: str
    root: type
    load: Callable[[Path, list[Read]], object]
    example: str
    classes: Mapping[str, type | None] = field(default_factory=dict)
    like: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    """One field of a table, as the page shows it."""

    key: str
    kind: str
    default: str
    text: str
    anchor: str


@dataclass(frozen=True)
class Section:
    """One table of the file."""

    table: str  # dotted, "" for the top level, "name[]" for an array's tables
    text: str
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Reference:
    """What one document's page shows, and what is wrong with its documentation."""

    document: Document
    sections: tuple[Section, ...]
    problems: tuple[str, ...]
    used: frozenset[tuple[type, str]]  # the entries it took


# -- the descriptions ------------------------------------------------------------


def _markdown(text: str) -> str:
    """Docstring text as the page shows it: code in single backticks, a page of
    docs/ as a link."""
    text = re.sub(r":[a-z]+:`~?(?:[\w.]+\.)?([\w]+)`", r"`\1`", text)
    text = re.sub(r"\bdocs/([\w/-]+\.md)\b", r"[\1](../\1)", text)
    return text.replace("``", "`").replace("|", "\\|")


def _sentence(text: str) -> str:
    """``text`` with a capital first letter (not "gRPC" or "`code`")."""
    first = text.split(" ", 1)[0]
    return text[:1].upper() + text[1:] if first.isalpha() and first.islower() else text


def _own_doc(cls: type) -> str:
    doc = cls.__dict__.get("__doc__") or ""
    if dataclasses.is_dataclass(cls) and doc.startswith(cls.__name__ + "("):
        return ""  # the signature dataclasses writes for a class without a docstring
    return inspect.cleandoc(doc)


def summary(cls: type) -> str:
    """The first paragraph of a class's own docstring, on one line."""
    paragraph = _own_doc(cls).split("\n\n", 1)[0]
    return " ".join(paragraph.split())


def _own_entries(cls: type) -> dict[str, Entry]:
    lines = _own_doc(cls).splitlines()
    if "Attributes:" not in lines:
        return {}
    found: dict[str, Entry] = {}
    current: list[str] = []

    def close() -> None:
        if current:
            match = _ENTRY.fullmatch(" ".join(current))
            if match is None:
                raise ValueError(f"{cls.__qualname__}: unreadable entry {current[0]!r}")
            kind, default = None, None
            for part in filter(None, (p.strip() for p in (match["paren"] or "").split(";"))):
                if part.startswith("default:"):
                    default = part.removeprefix("default:").strip()
                else:
                    kind = part
            found[match["name"]] = Entry(cls, match["name"], match["text"], kind, default)
            current.clear()

    for line in lines[lines.index("Attributes:") + 1 :]:
        if line.startswith("        "):
            current.append(line.strip())
        elif line.startswith("    ") and line.strip():
            close()
            current.append(line.strip())
        elif line.strip() or current:
            close()
            if line.strip():
                break
    close()
    return found


def entries(cls: type) -> dict[str, Entry]:
    """The ``Attributes:`` entries of ``cls`` and its bases (its own win)."""
    merged: dict[str, Entry] = {}
    for base in reversed(cls.__mro__):
        merged.update(_own_entries(base))
    return merged


def _mentions(hint: Any, kind: type) -> bool:
    return hint is kind or any(_mentions(arg, kind) for arg in typing.get_args(hint))


def _settings_class(hint: Any) -> type | None:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        found = _settings_class(arg)
        if found is not None:
            return found
    return None


# -- what the loader reads -------------------------------------------------------


@dataclass
class _Field:
    key: str
    expected: str | None
    default: Any
    required: bool


def _fields(reads: Iterable[Read]) -> dict[str, dict[str, _Field]]:
    """Every table's fields, merged over the reads (a key tested with ``has`` before
    it is read is optional whatever the read says)."""
    tables: dict[str, dict[str, _Field]] = {"": {}}
    for read in reads:
        table = _INDEX.sub("[]", read.table)
        known = tables.setdefault(table, {}).get(read.key)
        if known is None:
            tables[table][read.key] = _Field(read.key, read.expected, read.default, read.required)
            continue
        known.required = known.required and read.required
        if known.expected is None and read.expected is not None:
            known.expected, known.default = read.expected, read.default
    return tables


def _example_tables(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    order = [prefix]
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping):
            order += _example_tables(value, name)
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            for item in value:
                order += _example_tables(item, name + "[]")
    return list(dict.fromkeys(order))


def _parent(table: str) -> tuple[str, str]:
    parent, _, key = table.rpartition(".")
    return parent, key.removesuffix("[]")


class _Holders:
    """Which class documents each table, and under which prefix of its entries."""

    def __init__(self, document: Document) -> None:
        self.document = document
        self._cache: dict[str, tuple[type, str]] = {"": (document.root, "")}

    def __call__(self, table: str) -> tuple[type, str]:
        if table not in self._cache:
            parent, key = _parent(table)
            owner, prefix = self(parent)
            cls: type | None = None
            if table in self.document.classes:
                cls = self.document.classes[table]
            elif not prefix:
                hints = typing.get_type_hints(owner)
                cls = _settings_class(hints[key]) if key in hints else None
            self._cache[table] = (cls, "") if cls is not None else (owner, f"{prefix}{key}.")
        return self._cache[table]


def _literal(text: str) -> bool:
    try:
        tomllib.loads(f"value = {text.strip('`')}")
    except tomllib.TOMLDecodeError:
        return False
    return True


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{}" if not value else repr(dict(value))
    return json.dumps(str(value))


def _heading(table: str) -> str:
    if not table:
        return "Top level"
    if table.endswith("[]"):
        return f"`[[{table[:-2]}]]`"
    return f"`[{table.replace('[]', '')}]`"


def _anchor(table: str, key: str = "") -> str:
    return ".".join(p for p in (table.replace("[]", ""), key) if p)


def _load(document: Document) -> list[Read]:
    reads: list[Read] = []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / document.file
        path.write_text(document.example, encoding="utf-8")
        document.load(path, reads)
    return reads


def collect(document: Document) -> Reference:
    """Load ``document``'s example with its loader and match each field it read
    with its description."""
    return _Collector(document).reference()


class _Collector:
    """One document's sections, the entries they took, and what is amiss."""

    def __init__(self, document: Document) -> None:
        self.document = document
        self.tables = _fields(_load(document))
        self.holders = _Holders(document)
        self.problems: list[str] = []
        self.used: set[tuple[type, str]] = set()
        self.where = f"docs/reference/{document.name}.md"

    def reference(self) -> Reference:
        order = _example_tables(tomllib.loads(self.document.example))
        for table, fields in self.tables.items():
            if table not in order and any(f.expected not in _TABLE_KINDS for f in fields.values()):
                self.problems.append(f"{self.where}: {_heading(table)} is not in the example")
        sections = []
        for table in [t for t in order if t in self.tables] + [
            t for t in self.tables if t not in order
        ]:
            rows = [
                self.row(table, found)
                for found in self.tables[table].values()
                if found.expected not in _TABLE_KINDS
            ]
            if rows:  # a table of tables only ([models]) has no section
                listed = list(entries(self.holders(self.document.like.get(table, table))[0]))
                rows.sort(key=lambda r: listed.index(r.key) if r.key in listed else len(listed))
                sections.append(Section(table, self.text(table), tuple(rows)))
        return Reference(self.document, tuple(sections), tuple(self.problems), frozenset(self.used))

    def entry(self, table: str, key: str) -> tuple[Entry | None, str, bool]:
        """The entry of ``key`` in ``table``, its holder's name, whether it is a path."""
        owner, prefix = self.holders(self.document.like.get(table, table))
        found = entries(owner).get(prefix + key)
        if found is not None:
            self.used.add((found.owner, found.name))
        hint = None if prefix else typing.get_type_hints(owner).get(key)
        return found, f"{owner.__module__}.{owner.__qualname__}", _mentions(hint, Path)

    def text(self, table: str) -> str:
        """What ``table`` is: its class's summary, or its entry in its parent's."""
        if not table:
            return ""
        owner, prefix = self.holders(table)
        if not prefix:
            text = summary(owner)
            if not text:
                self.problems.append(
                    f"{self.where}: {_heading(table)}: {owner.__qualname__} has no docstring"
                )
            return _sentence(_markdown(text))
        described, owner_name, _ = self.entry(*_parent(table))
        if described is None:
            self.problems.append(
                f"{self.where}: {_heading(table)}: no description: add an entry "
                f"`{prefix[:-1]}: ...` to the Attributes of {owner_name}"
            )
            return ""
        return _sentence(_markdown(described.text))

    def row(self, table: str, found: _Field) -> Row:
        """The row of one field, its description checked against the loader."""
        name = f"{_heading(table)} `{found.key}`" if table else f"`{found.key}`"
        wrong = self.problems
        like = self.document.like.get(table)
        if like is not None and found.key not in self.tables.get(like, {}):
            wrong.append(f"{self.where}: {name} is not a field of [{like}]")
        described, owner, is_path = self.entry(table, found.key)
        kind, text = found.expected, ""
        if found.required:
            default = "required"
        else:
            default = "—" if found.default is None else f"`{_value(found.default)}`"
        if described is None:
            wrong.append(
                f"{self.where}: {name}: no description: add an entry `{found.key}: ...` "
                f"to the Attributes of {owner}"
            )
        else:
            text = described.text
            if described.type is not None and kind is not None:
                wrong.append(
                    f"{self.where}: {name}: the loader expects {kind}; the entry's type "
                    f"({described.type}) is for a field read unchecked: remove it"
                )
            kind = kind or described.type
            if described.default is not None and _literal(described.default):
                wrong.append(
                    f"{self.where}: {name}: default {described.default} is typed by hand; "
                    "a value comes from the loader (prose only, for a default that "
                    "depends on something else)"
                )
            default = described.default or default
        if kind is None:
            wrong.append(
                f"{self.where}: {name}: read unchecked or only asked about: state its "
                f"type in its entry, `{found.key} (a ...): ...`"
            )
        elif "table" in kind:
            wrong.append(f"{self.where}: {name}: a table the example leaves out: add it")
        kind = re.sub(r"'([^']*)'", r"`\1`", kind or "")
        if is_path and kind == "a string":
            kind = "a string: a path"
        text = _sentence(_markdown(text))
        return Row(found.key, kind, _markdown(default), text, _anchor(table, found.key))


def problems(references: Sequence[Reference]) -> list[str]:
    """What is wrong across ``references``: theirs, and the entries none took (an
    entry of a class shared by two files only needs one of them)."""
    found = [p for reference in references for p in reference.problems]
    used = frozenset().union(*(r.used for r in references))
    owners = {owner for owner, _ in used}
    for owner in sorted(owners, key=lambda c: (c.__module__, c.__qualname__)):
        for name, described in entries(owner).items():
            if described.owner is owner and (owner, name) not in used:
                found.append(
                    f"{owner.__module__}.{owner.__qualname__}: entry {name!r} names no "
                    "field the loader reads: remove it, or correct its name"
                )
    return found


# -- the page --------------------------------------------------------------------


COMMON = """\
A relative path is relative to the file's folder. A wrong field, or one this page does
not list, is refused when the file is loaded, with the file, the field and what was
expected (the *expected* column below says it in the same words)."""


def render(reference: Reference) -> str:
    """The page of one document."""
    document = reference.document
    lines = [
        f"# {document.title}",
        "",
        "<!-- Generated by `python -m tools.config_reference` from the code (each settings",
        "class's Attributes and what the loader reads): do not edit; `make docs` fails",
        "when it is stale. -->",
        "",
        document.intro.strip(),
        "",
        COMMON,
        "",
        '??? example "A file with every table"',
        "",
        "    ```toml",
        *(f"    {line}" if line else "" for line in document.example.strip().splitlines()),
        "    ```",
    ]
    for section in reference.sections:
        lines += ["", f"## {_heading(section.table)} {{#{_anchor(section.table) or 'top'}}}", ""]
        if section.text:
            lines += [section.text, ""]
        lines += ["| field | expected | default | what it does |", "|---|---|---|---|"]
        for row in section.rows:
            lines.append(
                f'| <a id="{row.anchor}"></a>`{row.key}` | {row.kind} | {row.default} '
                f"| {row.text} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail when a page is stale")
    parser.add_argument("--out", type=Path, default=PAGES)
    args = parser.parse_args(argv)
    from tools.config_documents import DOCUMENTS

    try:
        references = [collect(make()) for make in DOCUMENTS]
    except ConfigError as exc:
        print(f"config_reference: an example does not load: {exc}", file=sys.stderr)
        return 1
    wrong = problems(references)
    for reference in references:
        page = args.out / f"{reference.document.name}.md"
        text = render(reference)
        current = page.read_text(encoding="utf-8") if page.is_file() else None
        if args.check and current != text:
            wrong.append(f"{page}: stale: run `python -m tools.config_reference`")
        elif not args.check and current != text:
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(text, encoding="utf-8")
            print(f"wrote {page}", file=sys.stderr)
    for problem in wrong:
        print(problem, file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # run as a script from a checkout
    raise SystemExit(main())
