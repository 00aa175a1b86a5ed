"""The one rule for model names and versions, on every path a name or a version
enters: a request to either server (REST path, gRPC message, MQTT topic), a
manifest, a publish, an update plan, and a file or target path made of them.

A model name (:data:`MODEL_NAME`) is:

- one path segment of the portable file-name characters (letters, digits,
  ``.``, ``_``, ``-``), so it is the same in a file name, a URL, a TUF target
  path and an MQTT topic, with nothing to escape;
- it starts with a letter or a digit (no hidden files, nothing that reads as a
  command-line option) and holds no ``..`` (never ``.`` or ``..``, nothing that
  reads as a parent directory);
- at most 128 characters, far below a file name's 255 bytes with the
  suffixes the repository adds (``<sha256>.<version>.json``).

A version is a decimal integer from 1 to :data:`MAX_VERSION`, written with at
most 19 ASCII digits: a longer one is refused before ``int()`` sees it (Python
refuses to convert more than 4,300 digits, with an error nobody would catch).

Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import TypeGuard

from edge_core.errors import BadRequest

__all__ = [
    "MAX_VERSION",
    "MODEL_NAME",
    "MODEL_NAME_PATTERN",
    "MODEL_NAME_RULE",
    "VERSION_RULE",
    "check_model_name",
    "is_model_name",
    "parse_version",
]

MODEL_NAME = re.compile(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MODEL_NAME_RULE = (
    "1-128 letters, digits, '.', '_' or '-', starting with a letter or a digit, without '..'"
)
MODEL_NAME_PATTERN = f"^{MODEL_NAME.pattern}$"  # the rule in a JSON schema (OpenAPI)
MAX_VERSION = 2**63 - 1  # what SQLite and JSON peers hold as an integer
VERSION_RULE = f"a decimal integer from 1 to {MAX_VERSION}"
_VERSION = re.compile(r"[0-9]{1,19}")


def is_model_name(name: object) -> TypeGuard[str]:
    return isinstance(name, str) and MODEL_NAME.fullmatch(name) is not None


def check_model_name(name: object) -> str:
    """``name``, if it is a model name.

    Raises:
        BadRequest: it is not; the message gives the rule (and no more than
            the first 80 characters of what came).
    """
    if not is_model_name(name):
        raise BadRequest(f"model name {name!r:.80}: expected {MODEL_NAME_RULE}")
    return name


def parse_version(text: str) -> int | None:
    """A requested version: ``None`` for ``""`` (the newest), else its integer.

    Raises:
        BadRequest: it is not a version (``-1``, ``0``, ``1e9``, ``0x10``, 5,000 digits).
    """
    if text == "":
        return None
    if _VERSION.fullmatch(text) is None or not 1 <= int(text) <= MAX_VERSION:
        raise BadRequest(f"model version {text!r:.40}: expected {VERSION_RULE}")
    return int(text)
