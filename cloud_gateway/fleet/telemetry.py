"""What a device's telemetry says, checked and bounded: pure functions of its payloads.

A device sends the kinds of :mod:`edge_agent.reports` (``status``, ``decisions``,
``latency``) on ``devices/<id>/telemetry/<kind>`` over MQTT, or together in one
``POST /v2/telemetry`` (``{kind: document}``) with its update check when it has no
broker. Each becomes the columns of its kind in ``device_status`` and in the minute's
``device_history`` point (:func:`columns`). Everything a device sends is untrusted:
numbers must be finite and in range, strings are cut to a length, maps to a number of
entries, and a payload that is not what its kind says is refused whole
(:class:`~edge_core.errors.BadRequest`), never half taken. Text keeps whatever
characters it has: the pages escape it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from edge_core.errors import BadRequest

__all__ = [
    "KINDS",
    "MAX_PAYLOAD_BYTES",
    "columns",
    "decode",
    "history_columns",
]

KINDS = ("status", "decisions", "latency")  # the others (ota, thermal, streams) are not kept
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_TEXT = 200
MAX_ENTRIES = 32
REJECT = "REJECT"


def decode(payload: bytes) -> dict[str, Any]:
    """A payload's JSON object.

    Raises:
        BadRequest: over :data:`MAX_PAYLOAD_BYTES`, not JSON, or not an object.
    """
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise BadRequest(f"telemetry over {MAX_PAYLOAD_BYTES} bytes")
    try:
        document = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"telemetry is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise BadRequest("telemetry is a JSON object")
    return document


def _text(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"telemetry: {what} must be a string")
    return value[:MAX_TEXT].encode("utf-8", "replace").decode("utf-8")


def _number(value: Any, what: str, low: float = 0.0, high: float = 1e9) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"telemetry: {what} must be a number")
    if not math.isfinite(value) or not low <= value <= high:
        raise BadRequest(f"telemetry: {what} must be from {low:g} to {high:g}")
    return float(value)


def _count(value: Any, what: str) -> int | None:
    number = _number(value, what, 0, 2**53)
    return None if number is None else int(number)


def _flag(value: Any, what: str) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise BadRequest(f"telemetry: {what} must be true or false")
    return value


def _map(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"telemetry: {what} must be an object")
    return dict(list(value.items())[:MAX_ENTRIES])


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _status(document: dict[str, Any]) -> dict[str, Any]:
    models = {}
    for name, entry in _map(document.get("models"), "models").items():
        entry = _map(entry, f"models.{name[:40]}")
        version = _count(entry.get("version"), "a model's version")
        models[str(name)[:MAX_TEXT]] = {
            "version": version,
            "variant": _text(entry.get("variant"), "a model's variant") or "",
        }
    temperatures: dict[str, float | None] = {}
    for zone, value in _map(document.get("temperatures"), "temperatures").items():
        temperatures[str(zone)[:64]] = _number(value, "a temperature", -100, 300)
    known = [t for t in temperatures.values() if t is not None]
    queue = _map(document.get("queue"), "queue")
    offload = _map(document.get("offload"), "offload")
    refusals = _map(offload.get("guard_refusals"), "offload.guard_refusals")
    return {
        "profile": _text(document.get("profile"), "profile"),
        "power_mode": _text(document.get("power_mode"), "power_mode"),
        "models": _json(models),
        "temperatures": _json(temperatures),
        "hottest": max(known) if known else None,
        "throttled": bool(_flag(document.get("throttled"), "throttled")),
        "critical": bool(_flag(document.get("critical"), "critical")),
        "cpu_load": _number(document.get("cpu_load"), "cpu_load", 0, 1e4),
        "breaker": (_text(offload.get("breaker"), "offload.breaker") or "")[:16] or None,
        "guard_refusals": sum(_count(v, "a refusal count") or 0 for v in refusals.values()),
        "queue_waiting": _count(queue.get("waiting"), "queue.waiting"),
        "queue_dropped": _count(queue.get("dropped"), "queue.dropped"),
        "interval_s": _number(document.get("interval_s"), "interval_s", 0.1, 86400 * 7),
    }


def _decisions(document: dict[str, Any]) -> dict[str, Any]:
    entries = document.get("decisions", [])
    if not isinstance(entries, list):
        raise BadRequest("telemetry: decisions must be a list")
    by_action: dict[str, int] = {}
    for entry in entries[: MAX_ENTRIES * 4]:
        entry = _map(entry, "a decision")
        action = (_text(entry.get("action"), "a decision's action") or "?")[:32]
        by_action[action] = by_action.get(action, 0) + (_count(entry.get("count"), "count") or 0)
    if len(by_action) > MAX_ENTRIES:
        raise BadRequest(f"telemetry: more than {MAX_ENTRIES} actions")
    return {
        "decisions": _json(dict(sorted(by_action.items()))),
        "degraded": _count(document.get("degraded"), "degraded") or 0,
    }


def _latency(document: dict[str, Any]) -> dict[str, Any]:
    summary = {}
    for answerer, entry in _map(document.get("by_answerer"), "by_answerer").items():
        entry = _map(entry, "a latency")
        summary[str(answerer)[:32]] = {
            key: _number(entry.get(key), f"latency {key}", 0, 1e7)
            for key in ("p50_ms", "p95_ms", "p99_ms")
        }
    return {"latency": _json(summary)}


_PARSERS = {"status": _status, "decisions": _decisions, "latency": _latency}


def columns(kind: str, document: dict[str, Any]) -> dict[str, Any]:
    """The ``device_status`` columns a document of ``kind`` sets.

    Raises:
        BadRequest: an unknown kind, or a document that is not what its kind says.
    """
    parser = _PARSERS.get(kind)
    if parser is None:
        raise BadRequest(f"telemetry: kind must be one of {', '.join(KINDS)}")
    return parser(document)


def history_columns(kind: str, values: dict[str, Any]) -> dict[str, Any]:
    """The ``device_history`` columns of a kind's status columns (:func:`columns`)."""
    if kind == "status":
        return {
            "hottest": values["hottest"],
            "cpu_load": values["cpu_load"],
            "queue_waiting": values["queue_waiting"],
        }
    if kind == "decisions":
        return {"decisions": values["decisions"], "degraded": values["degraded"]}
    latency = json.loads(values["latency"])
    return {
        "local_ms": (latency.get("device") or {}).get("p50_ms"),
        "offload_ms": (latency.get("cloud") or {}).get("p50_ms"),
    }


def refused(decisions: dict[str, int], guard_refusals: int | None) -> int:
    """Requests the device refused: the policy's REJECTs and the exit guard's refusals."""
    return decisions.get(REJECT, 0) + (guard_refusals or 0)
