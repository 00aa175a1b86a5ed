"""Logging helpers both sides use."""

from __future__ import annotations

import logging
import threading

__all__ = ["warn_once"]

_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(logger: logging.Logger, message: str) -> None:
    """Warn of ``message`` once a process (later: at debug level). For what holds for
    the whole process, such as an execution provider this ONNX Runtime build lacks:
    a device that loads a model at every update says it once, not every time. The
    messages come from the profile's settings, a bounded set."""
    with _warned_lock:
        first = message not in _warned
        _warned.add(message)
    logger.log(logging.WARNING if first else logging.DEBUG, message)
