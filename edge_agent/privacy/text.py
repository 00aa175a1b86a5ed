"""Personal data in text: e-mail addresses, phone numbers, payment cards, IDs.

Patterns are checked where a checksum exists (Luhn for card numbers, mod 97
for IBANs) so that ordinary numbers are not flagged. :func:`find_pii` returns
non-overlapping matches; :func:`mask_pii` replaces each with its kind, e.g.
``[EMAIL]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["KINDS", "PiiMatch", "find_pii", "mask_pii"]

KINDS = ("email", "card", "iban", "national_id", "phone")

_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
_CARD = re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])")
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b")
_NATIONAL_ID = re.compile(r"\b\d{3}-\d{2}-\d{4}\b")  # US social security number layout
# Phone numbers in the layouts people write them: international (+44 20 7946 0958),
# North American ((555) 123-4567, 555-123-4567) and national with a trunk 0
# (020 7946 0958). Dates, versions and order numbers do not have these shapes.
_PHONE = re.compile(
    r"(?<![\w+])(?:"
    r"\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}"
    r"|(?:\(\d{3}\)\s?|\d{3}[ .-])\d{3}[ .-]\d{4}"
    r"|0\d{2,4}[ .-]\d{3,4}[ .-]?\d{3,4}"
    r")(?!\w)"
)


@dataclass(frozen=True)
class PiiMatch:
    kind: str
    start: int
    end: int
    text: str


def _luhn(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2 == 1:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


def _iban_ok(text: str) -> bool:
    compact = text.replace(" ", "")
    rearranged = compact[4:] + compact[:4]
    number = "".join(str(int(c, 36)) for c in rearranged)
    return int(number) % 97 == 1


def find_pii(text: str) -> list[PiiMatch]:
    """Personal data in ``text``, in order, without overlaps."""
    found: list[PiiMatch] = []
    taken: list[tuple[int, int]] = []

    def add(kind: str, match: re.Match[str]) -> None:
        start, end = match.span()
        if any(start < b and a < end for a, b in taken):
            return
        taken.append((start, end))
        found.append(PiiMatch(kind, start, end, match.group()))

    for match in _EMAIL.finditer(text):
        add("email", match)
    for match in _IBAN.finditer(text):
        if _iban_ok(match.group()):
            add("iban", match)
    for match in _CARD.finditer(text):
        digits = re.sub(r"\D", "", match.group())
        if 13 <= len(digits) <= 19 and _luhn(digits):
            add("card", match)
    for match in _NATIONAL_ID.finditer(text):
        add("national_id", match)
    for match in _PHONE.finditer(text):
        digits = re.sub(r"\D", "", match.group())
        if 8 <= len(digits) <= 15:
            add("phone", match)
    return sorted(found, key=lambda m: m.start)


def mask_pii(text: str) -> tuple[str, list[PiiMatch]]:
    """``text`` with each match replaced by ``[KIND]``, and the matches."""
    matches = find_pii(text)
    out = []
    position = 0
    for match in matches:
        out.append(text[position : match.start])
        out.append(f"[{match.kind.upper()}]")
        position = match.end
    out.append(text[position:])
    return "".join(out), matches
