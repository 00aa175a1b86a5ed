"""Waiting for something a server, a broker or a browser does in its own time."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    check: Callable[[], T],
    timeout: float = 10.0,
    what: str = "",
    *,
    interval: float = 0.05,
    log: Path | None = None,
) -> T:
    """Call ``check`` every ``interval`` seconds until it returns something true, and
    return that; past ``timeout`` seconds, fail naming ``what`` (and with ``log``'s
    text: what the service said meanwhile)."""
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            said = f"; the service said:\n{log.read_text()}" if log is not None else ""
            raise AssertionError(f"not within {timeout:g} s: {what or check}{said}")
        time.sleep(interval)
