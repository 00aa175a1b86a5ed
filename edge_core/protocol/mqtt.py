"""The Open Inference Protocol over MQTT v5: topics and payloads, for both sides.

Topics (a device sees only its own, by the broker's ACL)::

    offload/<model>/infer                 requests (any device publishes; the gateways
                                          share one subscription to offload/+/infer)
    devices/<device>/responses            the answers for one device
    devices/<device>/telemetry/<kind>     telemetry (status, decisions, latency, ota)
    devices/<device>/status               retained "online" / last will "offline"
    devices/<device>/streams/<name>/results   a stream's results (QoS 0)
    fleet/<group>/models                  retained rollout announcements of a group

A request is the REST body with binary tensors (a JSON header, then the
tensor bytes); MQTT v5 properties carry the rest: the response topic and
correlation data, and user properties for the header's length, the model
version and the device's bearer token (the gateway authenticates it as it
does every request). A response uses the same form; an error is a JSON body
``{"error": ..., "status": <http status>}`` with the user property
``status``; an answer names the server's protocol extensions (user property
``extensions``, comma-separated).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edge_core.errors import ProtocolError
from edge_core.protocol.rest import (
    decode_infer_request,
    decode_infer_response,
    encode_infer_request,
    encode_infer_response,
    load_json,
)
from edge_core.protocol.types import InferRequest, InferResponse, parse_length

__all__ = [
    "EXTENSIONS_PROPERTY",
    "REQUEST_FILTER",
    "MqttMessage",
    "announcement_topic",
    "client_id",
    "decode_request",
    "decode_response",
    "encode_error",
    "encode_request",
    "encode_response",
    "request_topic",
    "response_topic",
    "status_topic",
    "stream_results_topic",
    "telemetry_topic",
]

REQUEST_FILTER = "offload/+/infer"
HEADER_PROPERTY = "inference-header-content-length"
EXTENSIONS_PROPERTY = "extensions"


def request_topic(model: str) -> str:
    if not model or any(c in model for c in "/+#\x00"):
        raise ProtocolError(f"model name {model!r} cannot be part of an MQTT topic")
    return f"offload/{model}/infer"


def response_topic(device: str) -> str:
    return f"devices/{device}/responses"


def telemetry_topic(device: str, kind: str) -> str:
    return f"devices/{device}/telemetry/{kind}"


def status_topic(device: str) -> str:
    return f"devices/{device}/status"


def stream_results_topic(device: str, stream: str) -> str:
    return f"devices/{device}/streams/{stream}/results"


def announcement_topic(group: str) -> str:
    return f"fleet/{group}/models"


def client_id(device: str) -> str:
    """A device's MQTT client id: its own id, which the broker binds to its user name
    (the devices' listener sets it, the dynamic security plugin requires it). Mosquitto
    disconnects a client when another connects with its id: no device may have one that
    is not its own."""
    return device


@dataclass
class MqttMessage:
    """A payload and the user properties that go with it."""

    payload: bytes
    properties: dict[str, str]


def encode_request(request: InferRequest, *, token: str | None = None) -> MqttMessage:
    body, header_length = encode_infer_request(request)
    properties = {}
    if header_length is not None:
        properties[HEADER_PROPERTY] = str(header_length)
    if request.model_version:
        properties["model-version"] = request.model_version
    if token:
        properties["authorization"] = f"Bearer {token}"
    return MqttMessage(body, properties)


def decode_request(topic: str, payload: bytes, properties: dict[str, str]) -> InferRequest:
    """The request of a message on ``offload/<model>/infer``.

    Raises:
        ProtocolError: the topic or the payload is malformed.
    """
    parts = topic.split("/")
    if len(parts) != 3 or parts[0] != "offload" or parts[2] != "infer" or not parts[1]:
        raise ProtocolError(f"not a request topic: {topic!r}")
    length = properties.get(HEADER_PROPERTY)
    header_length = None if length is None else parse_length(length, HEADER_PROPERTY)
    request = decode_infer_request(payload, header_length)
    request.model_name = parts[1]
    request.model_version = properties.get("model-version", "")
    return request


def encode_response(
    response: InferResponse, request: InferRequest, *, extensions: Sequence[str] = ()
) -> MqttMessage:
    """An answer; ``extensions``: the server's protocol extensions, which a device over
    MQTT (where it cannot ask for the server's metadata) learns from its answers."""
    body, header_length = encode_infer_response(response, request)
    properties = {"status": "200"}
    if extensions:
        properties[EXTENSIONS_PROPERTY] = ",".join(extensions)
    if header_length is not None:
        properties[HEADER_PROPERTY] = str(header_length)
    return MqttMessage(body, properties)


def encode_error(status: int, message: str) -> MqttMessage:
    return MqttMessage(
        json.dumps({"error": message, "status": status}).encode(), {"status": str(status)}
    )


def decode_response(payload: bytes, properties: dict[str, str]) -> tuple[int, InferResponse | str]:
    """``(200, response)``, or ``(status, error message)``.

    Raises:
        ProtocolError: the payload is malformed.
    """
    status = properties.get("status", "200")
    if status != "200":
        try:
            document: Any = load_json(payload, "the error", finite=False)
            message = str(document.get("error", "")) if isinstance(document, dict) else ""
        except ProtocolError:
            message = payload[:200].decode(errors="replace")
        try:
            code = parse_length(status, "status")
        except ProtocolError:
            code = 500
        return code, message
    length = properties.get(HEADER_PROPERTY)
    header_length = None if length is None else parse_length(length, HEADER_PROPERTY)
    return 200, decode_infer_response(payload, header_length)
