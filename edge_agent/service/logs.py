"""Structured logs: one JSON object a line, with the request id of the request being served.

The local API sets the request id (the caller's ``X-Request-Id`` or
``x-request-id`` metadata, else a fresh one) in a context variable for the
request's thread; every log line written while serving it carries it, and
the offload transports send it to the gateway as ``x-request-id``, so one id
follows a request from the application through the device to the cloud.
Under systemd, journald keeps the lines as they are (``journalctl -o cat``).
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any

__all__ = ["JsonFormatter", "request_id", "setup_logging"]

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

# attributes every LogRecord has; anything else came in `extra=` and is logged as a field
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        current = request_id.get()
        if current:
            entry["request_id"] = current
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(format: str = "json", level: str = "info") -> None:
    """Send the process's logs to stderr, as JSON lines or as text."""
    handler = logging.StreamHandler(sys.stderr)
    if format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("edge-agent: %(levelname)s: %(message)s"))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
