"""MQTT on both sides: the ``[mqtt]`` settings and the paho-mqtt 2 client.

paho's types stop here. :func:`new_client` makes a client (callback API 2,
MQTT v5, reconnecting by itself); :func:`publish` sends with MQTT v5
properties and returns our :class:`Published` (paho's ``MQTTMessageInfo`` and
its integer codes never reach a caller); :func:`read_mqtt` reads an
``[mqtt]`` table the same way for the agent and the gateway.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_core.fields import Fields
from edge_core.tls import TLSSettings, read_tls

__all__ = [
    "BrokerWatch",
    "MqttSettings",
    "Published",
    "new_client",
    "no_delay",
    "publish",
    "publish_properties",
    "read_mqtt",
    "user_properties",
]


@dataclass(frozen=True)
class MqttSettings:
    """The fleet's MQTT broker and how to sign in to it.

    Attributes:
        host: the broker's host name or address.
        port: its port (8883 is the usual one for TLS).
        username (default: the device id): the user name on the broker.
        password_file (default: the device's token, from ``[gateway]`` or the
            ``[ota]`` bundle): a file holding the password (mode 0600).
        keepalive: seconds between pings while nothing else is sent.
    """

    host: str = "127.0.0.1"
    port: int = 1883
    username: str | None = None  # agent: the device id; gateway: "_gateway"
    password: str | None = None  # read from password_file by whoever needs it
    password_file: Path | None = None
    tls: TLSSettings | None = None
    keepalive: int = 30


def read_mqtt(
    m: Fields, resolve: Callable[[str], Path], *, username: str | None = None
) -> MqttSettings:
    """The fields of an ``[mqtt]`` table that both sides share (the caller reads its
    own and calls ``m.done()``). ``username`` is the default user name.

    Raises:
        ConfigError: a field is wrong.
    """
    defaults = MqttSettings()
    password_file = m.string("password_file", None)
    return MqttSettings(
        host=m.string("host", defaults.host),
        port=m.integer("port", defaults.port, minimum=1, maximum=65535),
        username=m.string("username", username),
        password_file=resolve(password_file) if password_file else None,
        tls=read_tls(m, resolve),
        keepalive=m.integer("keepalive", defaults.keepalive, minimum=5),
    )


@dataclass(frozen=True)
class Published:
    """What became of a publish: ``mid`` is acknowledged later (QoS 1); ``error`` says
    why the client did not take it (``None``: queued or sent)."""

    mid: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def publish(
    client: Any,
    topic: str,
    payload: bytes | str,
    *,
    qos: int = 1,
    retain: bool = False,
    response_topic: str | None = None,
    correlation: bytes | None = None,
    user: dict[str, str] | None = None,
    expiry_s: int | None = None,
) -> Published:
    """Publish on a paho client with MQTT v5 properties; paho's result translated."""
    import paho.mqtt.client as mqtt

    props = publish_properties(
        response_topic=response_topic, correlation=correlation, user=user, expiry_s=expiry_s
    )
    info = client.publish(topic, payload, qos=qos, retain=retain, properties=props)
    if info.rc == mqtt.MQTT_ERR_SUCCESS:
        return Published(info.mid)
    return Published(info.mid, f"{mqtt.error_string(info.rc)} (paho code {info.rc})")


def user_properties(message: Any) -> dict[str, str]:
    """A message's MQTT v5 user properties as a dict."""
    properties = getattr(message, "properties", None)
    pairs = getattr(properties, "UserProperty", None) or []
    return {str(k): str(v) for k, v in pairs}


def new_client(
    client_id: str, username: str | None, password: str | None, tls: TLSSettings | None
) -> Any:
    """A paho client (callback API 2, MQTT v5) with its credentials, reconnecting by itself."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    if username or password:
        client.username_pw_set(username, password)
    if tls is not None:
        client.tls_set(
            ca_certs=str(tls.ca) if tls.ca else None,
            certfile=str(tls.cert) if tls.cert else None,
            keyfile=str(tls.key) if tls.key else None,
            cert_reqs=ssl.CERT_REQUIRED,
        )
    client.reconnect_delay_set(min_delay=1, max_delay=4)
    client.suppress_exceptions = True  # a failing callback is logged; the network thread lives
    return client


def no_delay(client: Any) -> None:
    """Send small packets at once (TCP_NODELAY): a request or an answer is one small
    packet, and Nagle's algorithm against a delayed ACK would hold each ~40 ms."""
    sock = client.socket()
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def publish_properties(
    *,
    response_topic: str | None = None,
    correlation: bytes | None = None,
    user: dict[str, str] | None = None,
    expiry_s: int | None = None,
) -> Any:
    """The MQTT v5 properties of a PUBLISH (``None`` when there are none)."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    if not (response_topic or correlation or user or expiry_s):
        return None
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    if response_topic:
        props.ResponseTopic = response_topic
    if correlation:
        props.CorrelationData = correlation
    if user:
        props.UserProperty = list(user.items())
    if expiry_s:
        props.MessageExpiryInterval = expiry_s
    return props


class BrokerWatch:
    """Says, in a log a person reads, that a client cannot reach its broker and keeps
    trying: the first failed attempt of an outage at once (paho retries silently every
    few seconds), then at most one line a minute, and when it is back."""

    def __init__(
        self,
        logger: logging.Logger,
        who: str,
        settings: MqttSettings,
        *,
        every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._where = f"{who}: the MQTT broker {settings.host}:{settings.port}"
        self._every_s = every_s
        self._clock = clock
        self._down_since: float | None = None
        self._said = 0.0
        self._failures = 0

    def attach(self, client: Any) -> None:
        client.on_connect_fail = self.failed

    def failed(self, client: Any = None, userdata: Any = None) -> None:
        now = self._clock()
        self._failures += 1
        if self._down_since is None:
            self._down_since = now
        elif now - self._said < self._every_s:
            return
        self._said = now
        self._log.warning(
            "%s cannot be reached (%d attempt%s, %.0f s); retrying every few seconds",
            self._where,
            self._failures,
            "" if self._failures == 1 else "s",
            now - self._down_since,
        )

    def connected(self) -> None:
        if self._down_since is not None:
            self._log.info(
                "%s is reachable again after %.0f s", self._where, self._clock() - self._down_since
            )
        self._down_since, self._failures = None, 0
