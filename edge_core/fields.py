"""Typed reading of parsed configuration documents (TOML, JSON) with clear errors.

Every file the project reads (device profiles, model manifests, agent and
gateway configs, policies) goes through :class:`Fields`, so that every wrong
value is reported the same way: the file, the dotted field, what was
expected and what came::

    device_profiles/rpi5.toml: runtime.threads: expected an integer >= 1, got 'four'

Unknown keys are refused too (a misspelt key silently ignored is a setting
silently lost).

Given a ``reads`` list, a :class:`Fields` notes there every field it is asked
for (a :class:`Read`: the table, the key, what was expected, the default), its
sub-tables too: ``tools/config_reference.py`` runs each loader so and makes
the configuration reference from what the loader itself accepts.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from edge_core.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (JetPack 6)
    import tomli as tomllib

__all__ = ["Fields", "Read", "is_decimal", "load_document", "resolver"]

_DECIMAL = re.compile(r"[0-9]+")


def is_decimal(text: str) -> bool:
    """Whether ``text`` is ASCII digits only (``str.isdigit`` also takes "²" and "٣",
    which ``int()`` then refuses or reads differently)."""
    return _DECIMAL.fullmatch(text) is not None


def resolver(path: Path) -> Callable[[str], Path]:
    """How the paths a file gives are read: ``~`` expanded, and a relative one taken
    relative to the file's folder, once (whatever the current directory)."""
    base = path.parent.absolute()

    def resolve(value: str) -> Path:
        candidate = Path(value).expanduser()
        return candidate if candidate.is_absolute() else base / candidate

    return resolve


T = TypeVar("T")
_MISSING = object()


def load_document(path: Path, error: type[ConfigError] = ConfigError) -> dict[str, Any]:
    """Parse a ``.toml`` or ``.json`` file into a dict.

    Raises:
        ConfigError (or ``error``): the file is missing, unreadable or not valid.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error("file not found", path=path) from None
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror}", path=path) from exc
    except UnicodeDecodeError as exc:
        raise error("not UTF-8 text", path=path) from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"invalid JSON at line {exc.lineno}: {exc.msg}", path=path) from exc
    except tomllib.TOMLDecodeError as exc:
        raise error(f"invalid TOML: {exc}", path=path) from exc
    if not isinstance(data, dict):
        raise error("expected a table/object at the top level", path=path)
    return data


@dataclass(frozen=True)
class Read:
    """One field a loader asked a :class:`Fields` for.

    ``table`` is the dotted table (``""``: the top level; a table of an array ends
    in ``[N]``). ``expected`` is what a wrong value's error says was expected
    (``"an integer >= 1"``), ``None`` for a key read unchecked or only tested with
    :meth:`Fields.has`. ``default`` is the value taken when the key is absent,
    unless ``required``.
    """

    table: str
    key: str
    expected: str | None
    default: Any = None
    required: bool = False


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Fields:
    """A view on one table of a parsed document, that reads typed values.

    ``prefix`` is the dotted path of the table (``""`` for the top level).
    Call :meth:`done` after reading a table to refuse keys that were not read.
    """

    def __init__(
        self,
        data: Mapping[str, Any],
        *,
        path: Path | None = None,
        prefix: str = "",
        error: type[ConfigError] = ConfigError,
        reads: list[Read] | None = None,
    ) -> None:
        self._data = data
        self._path = path
        self._prefix = prefix
        self._error = error
        self._reads = reads
        self._seen: set[str] = set()  # the keys read
        self._asked: set[str] = set()  # and those only asked about (optional tables)

    # -- errors -----------------------------------------------------------

    def field_name(self, key: str) -> str:
        return f"{self._prefix}.{key}" if self._prefix else key

    def fail(self, key: str | None, message: str) -> ConfigError:
        """An error about ``key`` (``None``: about this table as a whole)."""
        field = self.field_name(key) if key is not None else (self._prefix or None)
        return self._error(message, path=self._path, field=field)

    # -- reading ----------------------------------------------------------

    def has(self, key: str) -> bool:
        self._asked.add(key)
        self._note(key, None, None)
        return key in self._data

    def _note(self, key: str, expected: str | None, default: Any) -> None:
        if self._reads is not None:
            required = default is _MISSING
            default = None if required else default
            self._reads.append(Read(self._prefix, key, expected, default, required))

    def _get(self, key: str, default: Any, expected: str | None = None) -> Any:
        self._seen.add(key)
        self._note(key, expected, default)
        if key in self._data:
            return self._data[key]
        if default is _MISSING:
            raise self.fail(key, "missing (required)")
        return default

    def get(self, key: str, check: Callable[[Any], T], expected: str, default: Any = _MISSING) -> T:
        """Read ``key`` and convert it with ``check`` (which raises on a wrong value)."""
        value = self._get(key, default, expected)
        if value is default and default is not _MISSING:
            return value  # type: ignore[no-any-return]
        try:
            return check(value)
        except (TypeError, ValueError):
            raise self.fail(key, f"expected {expected}, got {_describe(value)}") from None

    def string(
        self, key: str, default: Any = _MISSING, *, choices: Sequence[str] | None = None
    ) -> Any:
        def check(value: Any) -> str:
            if not isinstance(value, str) or (choices is not None and value not in choices):
                raise ValueError
            return value

        expected = "a string" if choices is None else "one of " + ", ".join(map(repr, choices))
        return self.get(key, check, expected, default)

    def integer(
        self,
        key: str,
        default: Any = _MISSING,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> Any:
        def check(value: Any) -> int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError
            return int(self._bounded(value, minimum, maximum))

        return self.get(key, check, "an integer" + self._bounds(minimum, maximum), default)

    @staticmethod
    def _bounded(value: float, minimum: float | None, maximum: float | None) -> float:
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise ValueError
        return value

    @staticmethod
    def _bounds(minimum: float | None, maximum: float | None) -> str:
        bounds = []
        if minimum is not None:
            bounds.append(f">= {minimum}")
        if maximum is not None:
            bounds.append(f"<= {maximum}")
        return " " + " and ".join(bounds) if bounds else ""

    def number(
        self,
        key: str,
        default: Any = _MISSING,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> Any:
        def check(value: Any) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError
            return float(self._bounded(value, minimum, maximum))

        return self.get(key, check, "a number" + self._bounds(minimum, maximum), default)

    def boolean(self, key: str, default: Any = _MISSING) -> Any:
        def check(value: Any) -> bool:
            if not isinstance(value, bool):
                raise TypeError
            return value

        return self.get(key, check, "true or false", default)

    def str_list(
        self, key: str, default: Any = _MISSING, *, choices: Sequence[str] | None = None
    ) -> Any:
        def check(value: Any) -> list[str]:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise TypeError
            if choices is not None and any(v not in choices for v in value):
                raise ValueError
            return list(value)

        expected = "a list of strings"
        if choices is not None:
            expected += " from " + ", ".join(map(repr, choices))
        return self.get(key, check, expected, default)

    def int_list(self, key: str, default: Any = _MISSING) -> Any:
        def check(value: Any) -> list[int]:
            if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value
            ):
                raise TypeError
            return list(value)

        return self.get(key, check, "a list of integers", default)

    def float_list(self, key: str, default: Any = _MISSING) -> Any:
        def check(value: Any) -> list[float]:
            if not isinstance(value, list) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
            ):
                raise TypeError
            return [float(v) for v in value]

        return self.get(key, check, "a list of numbers", default)

    def table(self, key: str, default: Any = _MISSING) -> Fields:
        """The sub-table ``key`` (an empty one when absent and a default is given)."""
        value = self._get(key, default, "a table")
        if value is default and default is not _MISSING:
            value = {}
        if not isinstance(value, Mapping):
            raise self.fail(key, f"expected a table, got {_describe(value)}")
        return self._child(value, self.field_name(key))

    def _child(self, data: Mapping[str, Any], prefix: str) -> Fields:
        return Fields(data, path=self._path, prefix=prefix, error=self._error, reads=self._reads)

    def tables(self, key: str, default: Any = _MISSING) -> Iterator[Fields]:
        """The array of tables ``key`` (``[[key]]`` in TOML)."""
        value = self._get(key, default, "a list of tables")
        if value is default and default is not _MISSING:
            value = []
        if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
            raise self.fail(key, f"expected a list of tables, got {_describe(value)}")
        for index, item in enumerate(value):
            yield self._child(item, f"{self.field_name(key)}[{index}]")

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        """The value of ``key`` as parsed, unchecked."""
        return self._get(key, default)

    def names(self) -> list[str]:
        return list(self._data)

    def done(self) -> None:
        """Refuse the keys of this table that were never read.

        Raises:
            ConfigError: an unknown key (usually a misspelling).
        """
        known = self._seen | self._asked
        unknown = [key for key in self._data if key not in known]
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(known), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            listing = ", ".join(sorted(known)) or "none"
            raise self.fail(unknown[0], f"unknown field ({hint}known fields here: {listing})")
