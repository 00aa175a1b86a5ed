"""Offload over MQTT v5: request/response through the broker.

A request goes to ``offload/<model>/infer`` at QoS 1 with the device's
response topic and a fresh correlation id; the gateways (sharing the
subscription ``$share/gateways/offload/+/infer``) answer on that topic. The
wait is bounded by the request's deadline (also given to the gateway as the
``timeout`` parameter and the message's expiry, so a late request is not run).
"""

from __future__ import annotations

import math
import threading
import uuid
import weakref
from dataclasses import replace
from typing import Any

from edge_agent.mqtt import MqttConnection
from edge_agent.offload.base import Transport
from edge_core.errors import OffloadRejected, OffloadTimeout, OffloadUnavailable, ProtocolError
from edge_core.mqtt import user_properties
from edge_core.protocol.mqtt import (
    EXTENSIONS_PROPERTY,
    decode_response,
    encode_request,
    request_topic,
    response_topic,
)
from edge_core.protocol.types import InferRequest, InferResponse

__all__ = ["MqttTransport"]


class _Waiter:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.status = 0
        self.result: InferResponse | str = ""
        self.received = 0  # the response's payload, in bytes


_TRANSPORTS: weakref.WeakKeyDictionary[MqttConnection, MqttTransport] = weakref.WeakKeyDictionary()


class MqttTransport(Transport):
    name = "mqtt"
    asks_the_gateway = False

    def __init__(self, connection: MqttConnection, *, token: str | None = None) -> None:
        self.connection = connection
        self.token = token
        self._pending: dict[bytes, _Waiter] = {}
        self._lock = threading.Lock()
        self.unmatched = 0
        self.extensions: list[str] | None = None  # the gateway's, as its answers name them
        self.topic = response_topic(connection.device_id)
        connection.subscribe(self.topic, self._on_response)

    @classmethod
    def of(cls, connection: MqttConnection, *, token: str | None = None) -> MqttTransport:
        """The connection's one transport. Agents built one after another (a reload)
        share it, so the answers to requests still in flight reach their callers."""
        transport = _TRANSPORTS.get(connection)
        if transport is None:
            transport = _TRANSPORTS[connection] = cls(connection, token=token)
        transport.token = token
        return transport

    def _on_response(self, message: Any) -> None:
        correlation = getattr(message.properties, "CorrelationData", None)
        if not correlation:
            raise ProtocolError("a response without correlation data")  # dropped, counted
        with self._lock:
            waiter = self._pending.pop(bytes(correlation), None)
        if waiter is None:
            self.unmatched += 1  # late (its request timed out) or not ours
            return
        waiter.received = len(message.payload)
        properties = user_properties(message)
        named = properties.get(EXTENSIONS_PROPERTY)
        if named is not None:
            self.extensions = [e for e in named.split(",")[:64] if e]
        try:
            waiter.status, waiter.result = decode_response(message.payload, properties)
        except Exception as exc:  # whatever the payload, the caller is told at once
            waiter.status, waiter.result = 502, f"malformed response: {exc}"
        waiter.done.set()

    def infer(
        self, request: InferRequest, *, timeout: float, request_id: str = ""
    ) -> InferResponse:
        if not self.connection.connected:
            raise OffloadUnavailable("not connected to the MQTT broker")
        correlation = uuid.uuid4().bytes
        waiter = _Waiter()
        with self._lock:
            self._pending[correlation] = waiter
        outgoing = InferRequest(
            inputs=request.inputs,
            datatypes=request.datatypes,
            model_name=request.model_name,
            model_version=request.model_version,
            id=request.id or request_id,
            outputs=request.outputs,
            parameters={**request.parameters, "timeout": max(1, int(timeout * 1e6))},
        )
        message = encode_request(outgoing, token=self.token)
        if request_id:
            message.properties["x-request-id"] = request_id
        try:
            info = self.connection.publish(
                request_topic(request.model_name),
                message.payload,
                qos=1,
                response_topic=self.topic,
                correlation=correlation,
                properties=message.properties,
                expiry_s=max(1, math.ceil(timeout)),
            )
            if not info.ok:
                raise OffloadUnavailable(f"the broker did not take the request: {info.error}")
            if not waiter.done.wait(timeout):
                raise OffloadTimeout(f"no answer over MQTT within {timeout:.3f} s")
        finally:
            with self._lock:
                self._pending.pop(correlation, None)
        if waiter.status == 200 and isinstance(waiter.result, InferResponse):
            return replace(waiter.result, wire_bytes=(len(message.payload), waiter.received))
        if waiter.status in (502, 503):
            raise OffloadUnavailable(f"the gateway is unavailable: {waiter.result}")
        if waiter.status == 504:
            raise OffloadTimeout(f"the gateway gave up: {waiter.result}")
        raise OffloadRejected(
            f"the gateway refused ({waiter.status}): {waiter.result}", status=str(waiter.status)
        )

    def learnt_extensions(self) -> frozenset[str] | None:
        """What the gateway's answers said of its extensions (MQTT carries requests
        only: nothing can be asked)."""
        return None if self.extensions is None else frozenset(self.extensions)
