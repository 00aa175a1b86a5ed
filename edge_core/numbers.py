"""The one rule for numbers a client sends, on every path one enters: a JSON body
(telemetry, an update report, an admin's action), a form field or a query parameter.

A number is checked for its type and its range before anything uses it:

- an integer is a JSON integer (never ``true``, never ``1.0``), compared with its
  range as it is, so one of 400 digits is refused rather than overflowing a float
  (``math.isfinite(10**400)`` raises ``OverflowError``) or a database column
  (SQLite's and PostgreSQL's integers stop at 2^63 - 1);
- a number is a JSON integer or float, finite (``NaN`` and ``1e400``, which JSON
  reads as infinity, are refused), in its range;
- written as text (``text=True``: forms, query strings), it is ASCII digits only,
  with at most one ``.`` for a number: ``str.isdigit`` also takes "²", which
  ``int()`` then refuses, and ``int()`` and ``float()`` read "٣", " 3", "+3" and
  "3_0" as numbers nobody typed. The length is checked before ``int()`` sees the
  text (Python refuses more than 4,300 digits, with an error nobody would catch).

Every refusal is a :class:`~edge_core.errors.BadRequest` that names the field and
its range. Pure: no I/O.
"""

from __future__ import annotations

import math
import re

from edge_core.errors import BadRequest

__all__ = ["MAX_INTEGER", "integer", "number"]

MAX_INTEGER = 2**63 - 1  # what SQLite, PostgreSQL's BIGINT and JSON peers hold
_DIGITS = re.compile(r"[0-9]{1,19}")
_DECIMAL = re.compile(r"[0-9]{1,19}(?:\.[0-9]{1,19})?")


def integer(
    value: object, what: str, low: int = 0, high: int = MAX_INTEGER, *, text: bool = False
) -> int:
    """``value`` if it is an integer from ``low`` to ``high`` (with ``text``, also its
    ASCII decimal digits).

    Raises:
        BadRequest: anything else; the message names ``what`` and the range.
    """
    rule = f"{what} must be an integer from {low} to {high}"
    if isinstance(value, str) and text:
        if _DIGITS.fullmatch(value) is None:
            raise BadRequest(f"{rule}, in at most 19 ASCII digits (got {value!r:.40})")
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(rule)
    return value


def number(value: object, what: str, low: float, high: float, *, text: bool = False) -> float:
    """``value`` as a float if it is a finite number from ``low`` to ``high`` (with
    ``text``, also ASCII decimal digits with at most one ``.``).

    Raises:
        BadRequest: anything else; the message names ``what`` and the range.
    """
    rule = f"{what} must be a number from {_bound(low)} to {_bound(high)}"
    if isinstance(value, str) and text:
        if _DECIMAL.fullmatch(value) is None:
            raise BadRequest(
                f"{rule}, in at most 19 ASCII digits each side of one '.' (got {value!r:.40})"
            )
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(rule)
    # an int is compared as it is (exactly, whatever its size); a float must be finite
    if (isinstance(value, float) and not math.isfinite(value)) or not low <= value <= high:
        raise BadRequest(rule)
    return float(value)


def _bound(value: float) -> str:
    """A range's end as one writes it: 1000000, not 1e+06; 0.1 stays 0.1."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e16 else f"{value:g}"
