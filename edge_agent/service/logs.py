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
import threading
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


# Libraries that log a line per request at INFO (httpx: every update check's requests,
# a 404 for the next root among them): their warnings and errors stay, their chatter
# shows with level = "debug" only.
CHATTY = ("httpx", "httpcore", "urllib3", "grpc", "paho", "asyncio")


def setup_logging(format: str = "json", level: str = "info") -> None:
    """Send the process's logs to stderr, as JSON lines or as text: every line, an
    uncaught exception in any thread and a Python warning included, in that format."""
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
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "debug" else logging.WARNING)
    logging.captureWarnings(True)
    threading.excepthook = _log_thread_exception
    sys.excepthook = _log_exception


def _log_exception(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    logging.getLogger("edge_agent").critical(
        "uncaught %s: %s", kind.__name__, value, exc_info=(kind, value, tb)
    )


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    thread = args.thread.name if args.thread is not None else "?"
    logging.getLogger("edge_agent").error(
        "uncaught %s in thread %s: %s",
        args.exc_type.__name__,
        thread,
        args.exc_value,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),  # type: ignore[arg-type]
    )
