"""What a device's telemetry says, checked and bounded: pure functions of its payloads.

A device sends the kinds of :mod:`edge_agent.reports` (``status``, ``decisions``,
``latency``) on ``devices/<id>/telemetry/<kind>`` over MQTT, or together in one
``POST /v2/telemetry`` (``{kind: document}``) with its update check when it has no
broker. Each becomes the columns of its kind in ``device_status`` and in the minute's
``device_history`` point (:func:`columns`). Everything a device sends is untrusted:
numbers must be of their type, finite and in range (:mod:`edge_core.numbers`: an
integer of 400 digits is refused, never converted), strings are cut to a length, maps
to a number of entries, and a payload that is not what its kind says is refused whole
(:class:`~edge_core.errors.BadRequest`), never half taken. Text keeps whatever
characters it has (the pages escape it) but NUL, which PostgreSQL cannot store.

What is taken always fits its column on both databases, so that one device's document
cannot make the batch it is written in fail (:mod:`.store`): text is cut to the
column's length, and a count kept in an integer column (32 bits on PostgreSQL) is
taken up to 2^53 and kept at most :data:`MAX_COLUMN_COUNT`, which no device reaches.
"""

from __future__ import annotations

import json
from typing import Any

from edge_core.errors import BadRequest
from edge_core.numbers import MAX_INTEGER, integer, number

__all__ = [
    "KINDS",
    "MAX_PAYLOAD_BYTES",
    "body_schema",
    "columns",
    "decode",
    "history_columns",
    "stamp",
]

KINDS = ("status", "decisions", "latency")  # the others (ota, thermal, streams) are not kept
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_TEXT = 200
MAX_ENTRIES = 32
MAX_COUNT = 2**53  # JSON's exact integers
MAX_COLUMN_COUNT = 2**31 - 1  # an INTEGER column (PostgreSQL's are 32 bits)
REJECT = "REJECT"
TEMPERATURE_C = (-100.0, 300.0)
CPU_LOAD = (0.0, 1e4)
INTERVAL_S = (0.1, 86400.0 * 7)
LATENCY_MS = (0.0, 1e7)
BANDWIDTH = (0.0, 1e6)  # Mbit/s


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


def _text(value: Any, what: str, limit: int = MAX_TEXT) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"telemetry: {what} must be a string")
    text = value[:limit].encode("utf-8", "replace").decode("utf-8")
    return text.replace("\x00", "\ufffd")  # PostgreSQL's text holds no NUL


def _number(value: Any, what: str, low: float = 0.0, high: float = 1e9) -> float | None:
    return None if value is None else number(value, f"telemetry: {what}", low, high)


def _count(value: Any, what: str) -> int | None:
    return None if value is None else integer(value, f"telemetry: {what}", 0, MAX_COUNT)


def _column_count(value: int | None) -> int | None:
    return None if value is None else min(value, MAX_COLUMN_COUNT)


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
        temperatures[str(zone)[:64]] = _number(value, "a temperature", *TEMPERATURE_C)
    known = [t for t in temperatures.values() if t is not None]
    queue = _map(document.get("queue"), "queue")
    offload = _map(document.get("offload"), "offload")
    refusals = _map(offload.get("guard_refusals"), "offload.guard_refusals")
    link = _map(offload.get("link"), "offload.link")
    return {
        "profile": _text(document.get("profile"), "profile"),
        "power_mode": _text(document.get("power_mode"), "power_mode", 64),
        "models": _json(models),
        "temperatures": _json(temperatures),
        "hottest": max(known) if known else None,
        "throttled": bool(_flag(document.get("throttled"), "throttled")),
        "critical": bool(_flag(document.get("critical"), "critical")),
        "cpu_load": _number(document.get("cpu_load"), "cpu_load", *CPU_LOAD),
        "breaker": _text(offload.get("breaker"), "offload.breaker", 16) or None,
        "guard_refusals": _column_count(
            sum(_count(v, "a refusal count") or 0 for v in refusals.values())
        ),
        "link": _json(
            {
                "bytes_sent": _count(link.get("bytes_sent"), "offload.link.bytes_sent"),
                "bytes_received": _count(link.get("bytes_received"), "offload.link.bytes_received"),
                "rtt_ms": _number(link.get("rtt_ms"), "offload.link.rtt_ms", *LATENCY_MS),
                "bandwidth_mbit_s": _number(
                    link.get("bandwidth_mbit_s"), "offload.link.bandwidth_mbit_s", *BANDWIDTH
                ),
            }
        ),
        "queue_waiting": _column_count(_count(queue.get("waiting"), "queue.waiting")),
        "queue_dropped": _column_count(_count(queue.get("dropped"), "queue.dropped")),
        "interval_s": _number(document.get("interval_s"), "interval_s", *INTERVAL_S),
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
        "degraded": _column_count(_count(document.get("degraded"), "degraded")) or 0,
    }


def _latency(document: dict[str, Any]) -> dict[str, Any]:
    summary = {}
    for answerer, entry in _map(document.get("by_answerer"), "by_answerer").items():
        entry = _map(entry, "a latency")
        summary[str(answerer)[:32]] = {
            key: _number(entry.get(key), f"latency {key}", *LATENCY_MS)
            for key in ("p50_ms", "p95_ms", "p99_ms")
        }
    return {"latency": _json(summary)}


_PARSERS = {"status": _status, "decisions": _decisions, "latency": _latency}


def _range(kind: str, low: float, high: float) -> dict[str, Any]:
    return {"type": kind, "minimum": low, "maximum": high}


def body_schema() -> dict[str, Any]:
    """The JSON schema of ``POST /v2/telemetry``'s body (in the OpenAPI document): the
    fields of each kind that are kept, with the ranges the checks hold them to (text
    longer than its limit is cut, not refused; fields not named here are ignored, kinds
    not named here refused)."""
    count = _range("integer", 0, MAX_COUNT)
    order = {"seq": _range("integer", 0, MAX_INTEGER), "time": _range("number", 0, MAX_COUNT)}
    latency = {key: _range("number", *LATENCY_MS) for key in ("p50_ms", "p95_ms", "p99_ms")}
    kinds: dict[str, dict[str, Any]] = {
        "status": {
            "profile": {"type": "string"},
            "power_mode": {"type": "string"},
            "models": {"type": "object", "additionalProperties": {"type": "object", "properties": {
                "version": count, "variant": {"type": "string"}}}},
            "temperatures": {"type": "object",
                             "additionalProperties": _range("number", *TEMPERATURE_C)},
            "throttled": {"type": "boolean"},
            "critical": {"type": "boolean"},
            "cpu_load": _range("number", *CPU_LOAD),
            "queue": {"type": "object", "properties": {"waiting": count, "dropped": count}},
            "offload": {"type": "object", "properties": {
                "breaker": {"type": "string"},
                "guard_refusals": {"type": "object", "additionalProperties": count},
                "link": {"type": "object", "properties": {
                    "bytes_sent": count, "bytes_received": count,
                    "rtt_ms": _range("number", *LATENCY_MS),
                    "bandwidth_mbit_s": _range("number", *BANDWIDTH)}}}},
            "interval_s": _range("number", *INTERVAL_S),
        },
        "decisions": {
            "decisions": {"type": "array", "items": {"type": "object", "properties": {
                "action": {"type": "string"}, "reason": {"type": "string"}, "count": count}}},
            "degraded": count,
        },
        "latency": {
            "by_answerer": {"type": "object", "additionalProperties": {
                "type": "object", "properties": latency}},
        },
    }  # fmt: skip
    return {
        "type": "object",
        "description": "The device's periodic telemetry by kind, as over MQTT",
        "additionalProperties": False,  # another kind is refused
        "properties": {
            kind: {"type": "object", "properties": {**order, **fields}}
            for kind, fields in kinds.items()
        },
    }


def columns(kind: str, document: dict[str, Any]) -> dict[str, Any]:
    """The ``device_status`` columns a document of ``kind`` sets.

    Raises:
        BadRequest: an unknown kind, or a document that is not what its kind says.
    """
    parser = _PARSERS.get(kind)
    if parser is None:
        raise BadRequest(f"telemetry: kind must be one of {', '.join(KINDS)}")
    return parser(document)


def stamp(document: dict[str, Any]) -> tuple[int | None, float | None]:
    """A document's ``seq`` (the device's count of the messages it made, which orders
    them: a repeat or an older one never replaces a newer one) and ``time`` (its clock,
    in seconds since the epoch: which minute of the history it is, when plausible);
    ``None`` for either that is absent.

    Raises:
        BadRequest: a ``seq`` that is not an integer from 0 to 2^63 - 1 (what the
            database holds), a ``time`` that is not a number from 0 to 2^53.
    """
    seq, time = document.get("seq"), document.get("time")
    return (
        None if seq is None else integer(seq, "telemetry: seq", 0, MAX_INTEGER),
        None if time is None else number(time, "telemetry: time", 0, MAX_COUNT),
    )


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
