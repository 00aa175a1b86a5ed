"""The agent's one configuration object, loaded and validated in one place.

A TOML file; every field is optional (without a file: the detected profile,
the sample models, local only)::

    device_id = "cam-01"
    profile = "raspberry-pi-5"      # default: detected
    root = "/"                      # filesystem root for detection and temperatures
    model_dir = "models"            # relative paths are relative to this file
    policy = "policy.toml"          # default: the built-in policy
    deadline_ms = 1000              # a request's deadline unless it brings its own
    cache_entries = 256             # answers kept for the cached fallback tier

    state_dir = "/var/lib/edge-agent"   # the telemetry queue, OTA slots

    [gateway]                       # offload; absent: local only
    address = "127.0.0.1:8001"      # (not for mqtt: requests go through the broker)
    protocol = "grpc"               # grpc | http | mqtt
    token_file = "device.token"     # or token = "..." (the file is better: mode 0600)
    retries = 2
    [gateway.tls]
    ca = "ca.pem"
    cert = "device.pem"
    key = "device.key"

    [breaker]
    failures = 3
    cooldown_s = 5.0

    [privacy]
    face_detector = true            # search pictures for faces (needs the BlazeFace package)

    [ota]                           # over-the-air updates; absent: none
    bundle = "enrollment.json"      # from `cloud-gateway device add` (mode 0600)
    url = "http://127.0.0.1:8000"   # the gateway's REST address (default: the bundle's)
    state_dir = "/var/lib/edge-agent"   # slots, partial downloads, trusted metadata
                                        # (default: the top-level state_dir)
    interval_s = 3600               # periodic check, plus up to jitter_s at random
    jitter_s = 300
    expiry_slack_s = 0              # accept metadata expired this long ago (no real-time clock)
    bandwidth = 0                   # bytes/s for downloads (0: no cap)

    [mqtt]                          # the fleet's broker: telemetry, announcements, offload
    host = "broker.example"
    port = 8883
    username = "cam-01"             # default: the device id
    password_file = "device.token"  # default: the device's token (gateway or bundle)
    keepalive = 30
    [mqtt.tls]                      # as [gateway.tls]
    ca = "ca.pem"

    [telemetry]                     # needs [mqtt]; on by default when [mqtt] is there
    enabled = true
    interval_s = 30                 # status, decisions and latency every interval
    max_messages = 10000            # the on-disk queue's bound (oldest dropped, counted)

    [api]                           # the local inference API of `edge-agent run`
    host = "127.0.0.1"              # loopback only unless allow_remote (it has no auth)
    http_port = 8080                # 0: no HTTP
    grpc_port = 8081                # 0: no gRPC
    socket = "/run/edge-agent/api.sock"  # HTTP on a Unix socket instead of host:http_port
    allow_remote = false
    drain_s = 10                    # on SIGTERM, how long requests in flight may take
    max_body_bytes = 16777216

    [thermal]                       # the thermal and power control loop
    enabled = true
    interval_s = 5
    hysteresis_c = 5                # step back up only this far below the throttle point

    [logging]
    format = "json"                 # json (one object a line, with request ids) | text
    level = "info"
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.fields import Fields, load_document
from edge_agent.mqtt import MqttSettings
from edge_agent.offload.base import TLSSettings
from edge_agent.paths import default_model_dir

__all__ = [
    "AgentConfig",
    "ApiSettings",
    "BreakerConfig",
    "GatewaySettings",
    "LoggingSettings",
    "OtaSettings",
    "TelemetrySettings",
    "ThermalSettings",
    "load_agent_config",
    "read_tls",
]

STATE_DIR = Path("/var/lib/edge-agent")


@dataclass(frozen=True)
class GatewaySettings:
    address: str  # empty for mqtt
    protocol: str = "grpc"
    token: str | None = None
    retries: int = 2
    tls: TLSSettings | None = None


@dataclass(frozen=True)
class OtaSettings:
    bundle: Path
    state_dir: Path
    url: str | None = None
    interval_s: float = 3600.0
    jitter_s: float = 300.0
    expiry_slack_s: float = 0.0
    bandwidth: int = 0


@dataclass(frozen=True)
class TelemetrySettings:
    interval_s: float = 30.0
    max_messages: int = 10_000


@dataclass(frozen=True)
class ApiSettings:
    host: str = "127.0.0.1"
    http_port: int = 8080
    grpc_port: int = 8081
    socket: Path | None = None
    allow_remote: bool = False
    drain_s: float = 10.0
    max_body_bytes: int = 16 * 1024 * 1024


@dataclass(frozen=True)
class ThermalSettings:
    enabled: bool = True
    interval_s: float = 5.0
    hysteresis_c: float = 5.0


@dataclass(frozen=True)
class LoggingSettings:
    format: str = "json"
    level: str = "info"


@dataclass(frozen=True)
class BreakerConfig:
    failures: int = 3
    cooldown_s: float = 5.0


@dataclass(frozen=True)
class AgentConfig:
    device_id: str = "edge-device"
    profile: str | None = None
    root: Path = Path("/")
    model_dir: Path = field(default_factory=default_model_dir)
    policy: Path | None = None
    deadline_ms: float = 1000.0
    cache_entries: int = 256
    gateway: GatewaySettings | None = None
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    face_detector: bool = True
    ota: OtaSettings | None = None
    state_dir: Path = STATE_DIR
    mqtt: MqttSettings | None = None
    telemetry: TelemetrySettings | None = None
    api: ApiSettings = field(default_factory=ApiSettings)
    thermal: ThermalSettings = field(default_factory=ThermalSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    source: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _read_secret(path: Path, fields: Fields, name: str) -> str:
    try:
        mode = path.stat().st_mode
        secret = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise fields.fail(name, f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError:
        raise fields.fail(name, f"{path} is not UTF-8 text") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise fields.fail(
            name, f"{path} is readable by others (mode {oct(mode & 0o777)}); expected 0600"
        )
    if not secret:
        raise fields.fail(name, f"{path} is empty")
    return secret


def read_tls(fields: Fields, resolve: Callable[[str], Path]) -> TLSSettings | None:
    """The ``tls`` table of ``fields`` (``None`` when absent)."""
    if not fields.has("tls"):
        return None
    t = fields.table("tls")
    tls = TLSSettings(
        ca=resolve(t.string("ca")) if t.has("ca") else None,
        cert=resolve(t.string("cert")) if t.has("cert") else None,
        key=resolve(t.string("key")) if t.has("key") else None,
        server_name=t.string("server_name", None),
    )
    if (tls.cert is None) != (tls.key is None):
        raise t.fail("cert", "cert and key go together")
    t.done()
    return tls


def load_agent_config(path: Path | None) -> AgentConfig:
    """The configuration in ``path`` (the defaults when ``None``).

    Raises:
        ConfigError: the file is missing or malformed, or a field is wrong.
    """
    if path is None:
        return AgentConfig()
    fields = Fields(load_document(path), path=path)
    base = path.parent

    def resolve(value: str) -> Path:
        candidate = Path(value).expanduser()
        return candidate if candidate.is_absolute() else base / candidate

    defaults = AgentConfig()
    model_dir = fields.string("model_dir", None)
    policy = fields.string("policy", None)
    gateway = None
    if fields.has("gateway"):
        g = fields.table("gateway")
        token = g.string("token", None)
        token_file = g.string("token_file", None)
        if token is not None and token_file is not None:
            raise g.fail("token", "give token or token_file, not both")
        if token_file is not None:
            token = _read_secret(resolve(token_file), g, "token_file")
        protocol = g.string("protocol", "grpc", choices=["grpc", "http", "mqtt"])
        if protocol == "mqtt" and not fields.has("mqtt"):
            raise g.fail("protocol", "mqtt needs an [mqtt] section (the broker)")
        gateway = GatewaySettings(
            address=g.string("address", "" if protocol == "mqtt" else None),
            protocol=protocol,
            token=token,
            retries=g.integer("retries", 2, minimum=0),
            tls=read_tls(g, resolve),
        )
        g.done()
    b = fields.table("breaker", None)
    breaker = BreakerConfig(
        failures=b.integer("failures", 3, minimum=1),
        cooldown_s=b.number("cooldown_s", 5.0, minimum=0.0),
    )
    b.done()
    p = fields.table("privacy", None)
    face_detector = p.boolean("face_detector", True)
    p.done()
    state_dir = resolve(fields.string("state_dir", str(STATE_DIR)))
    ota = None
    if fields.has("ota"):
        o = fields.table("ota")
        ota = OtaSettings(
            bundle=resolve(o.string("bundle")),
            state_dir=resolve(o.string("state_dir", str(state_dir))),
            url=o.string("url", None),
            interval_s=o.number("interval_s", 3600.0, minimum=1.0),
            jitter_s=o.number("jitter_s", 300.0, minimum=0.0),
            expiry_slack_s=o.number("expiry_slack_s", 0.0, minimum=0.0),
            bandwidth=o.integer("bandwidth", 0, minimum=0),
        )
        o.done()
    mqtt = None
    if fields.has("mqtt"):
        m = fields.table("mqtt")
        password_file = m.string("password_file", None)
        mqtt = MqttSettings(
            host=m.string("host", "127.0.0.1"),
            port=m.integer("port", 1883, minimum=1, maximum=65535),
            username=m.string("username", None),
            password=_read_secret(resolve(password_file), m, "password_file")
            if password_file
            else None,
            tls=read_tls(m, resolve),
            keepalive=m.integer("keepalive", 30, minimum=5),
        )
        m.done()
    t = fields.table("telemetry", None)
    telemetry = None
    if t.boolean("enabled", mqtt is not None):
        if mqtt is None:
            raise t.fail("enabled", "telemetry needs an [mqtt] section (the broker)")
        telemetry = TelemetrySettings(
            interval_s=t.number("interval_s", 30.0, minimum=0.1),
            max_messages=t.integer("max_messages", 10_000, minimum=1),
        )
    t.done()
    config = AgentConfig(
        device_id=fields.string("device_id", defaults.device_id),
        profile=fields.string("profile", None),
        root=resolve(fields.string("root", "/")),
        model_dir=resolve(model_dir) if model_dir else defaults.model_dir,
        policy=resolve(policy) if policy else None,
        deadline_ms=fields.number("deadline_ms", defaults.deadline_ms, minimum=1.0),
        cache_entries=fields.integer("cache_entries", defaults.cache_entries, minimum=0),
        gateway=gateway,
        breaker=breaker,
        face_detector=face_detector,
        ota=ota,
        state_dir=state_dir,
        mqtt=mqtt,
        telemetry=telemetry,
        api=_api(fields.table("api", None), resolve),
        thermal=_thermal(fields.table("thermal", None)),
        logging=_logging(fields.table("logging", None)),
        source=path,
    )
    fields.done()
    return config


LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _api(a: Fields, resolve: Callable[[str], Path]) -> ApiSettings:
    socket = a.string("socket", None)
    api = ApiSettings(
        host=a.string("host", "127.0.0.1"),
        http_port=a.integer("http_port", 8080, minimum=0, maximum=65535),
        grpc_port=a.integer("grpc_port", 8081, minimum=0, maximum=65535),
        socket=resolve(socket) if socket else None,
        allow_remote=a.boolean("allow_remote", False),
        drain_s=a.number("drain_s", 10.0, minimum=0.0),
        max_body_bytes=a.integer("max_body_bytes", 16 * 1024 * 1024, minimum=1024),
    )
    if api.host not in LOOPBACK and not api.allow_remote:
        raise a.fail(
            "host",
            f"{api.host!r} is not a loopback address and the local API has no authentication; "
            "set allow_remote = true to serve it anyway",
        )
    a.done()
    return api


def _thermal(t: Fields) -> ThermalSettings:
    thermal = ThermalSettings(
        enabled=t.boolean("enabled", True),
        interval_s=t.number("interval_s", 5.0, minimum=0.05),
        hysteresis_c=t.number("hysteresis_c", 5.0, minimum=0.0),
    )
    t.done()
    return thermal


def _logging(g: Fields) -> LoggingSettings:
    settings = LoggingSettings(
        format=g.string("format", "json", choices=["json", "text"]),
        level=g.string("level", "info", choices=["debug", "info", "warning", "error"]),
    )
    g.done()
    return settings
