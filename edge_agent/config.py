"""The agent's one configuration object, loaded and validated in one place.

(Over 400 lines: this docstring is the reference of every field, and the readers
of the tables stay beside the settings they fill.)

A TOML file; every field is optional (without a file: the detected profile,
the sample models, local only)::

    device_id = "cam-01"
    profile = "raspberry-pi-5"      # default: detected
    profiles_dir = "profiles"       # device profiles (default: the bundled ones)
    root = "/"                      # filesystem root for detection and temperatures
    model_dir = "models"            # relative paths are relative to this file's folder
    policy = "policy.toml"          # default: the built-in policy
    deadline_ms = 1000              # a request's deadline unless it brings its own
    cache_entries = 256             # answers kept for the cached fallback tier

    state_dir = "/var/lib/edge-agent"   # the telemetry queue, OTA slots

    [gateway]                       # offload; absent: local only
    address = "127.0.0.1:8001"      # (not for mqtt: requests go through the broker); or a
                                    # list of replicas, ["gw-a:8001", "gw-b:8001"]: round
                                    # robin, and a request that cannot reach one goes to the
                                    # next within its deadline
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
    face_detector = true            # search pictures for faces (needs the detector's package)
    detector = "centerface"         # centerface | blazeface | blazeface+centerface
                                    # (default: the profile's [privacy] detector, else centerface)
    threshold = 0.5                 # the lowest score kept (default: the detector's measured one)
    scale = 1.0                     # CenterFace's input scale (default: the profile's, else 1)
    check_threshold = 0.2           # the stronger eye that redacted pictures must pass

    [ota]                           # over-the-air updates; absent: none
    bundle = "enrollment.json"      # from `cloud-gateway device add` (mode 0600)
    url = "http://127.0.0.1:8000"   # the gateway's REST address (default: the bundle's)
    state_dir = "/var/lib/edge-agent"   # slots, partial downloads, trusted metadata
                                        # (default: the top-level state_dir)
    interval_s = 3600               # periodic check, plus up to jitter_s at random
    jitter_s = 300
    expiry_slack_s = 0              # accept metadata expired this long ago (no real-time clock)
    bandwidth = 0                   # bytes/s for downloads (0: no cap)
    attempts = 4                    # download attempts per check (each resumes the last)
    timeout_s = 30                  # per read of a download
    min_rate = 4096                 # bytes/s every download (metadata too) must average over
                                    # each rate_window_s, and its deadline: rate_window_s +
                                    # its signed (or maximum) length / min_rate; slower, it is
                                    # abandoned, its partial kept for the next check (0: none)
    rate_window_s = 60
    max_model_bytes = 2147483648    # a larger signed blob or plaintext is refused unfetched
    min_free_bytes = 67108864       # free space a download must leave on its filesystem

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
    max_messages = 10000            # the on-disk queue's bound (oldest unsent dropped, counted)

    [api]                           # the local inference API of `edge-agent run`
    host = "127.0.0.1"              # loopback only unless allow_remote (it has no auth)
    http_port = 8080                # 0: no HTTP
    grpc_port = 8081                # 0: no gRPC
    socket = "/run/edge-agent/api.sock"  # HTTP on a Unix socket instead of host:http_port
    allow_remote = false
    drain_s = 10                    # on SIGTERM, how long requests in flight may take
    max_body_bytes = 16777216       # larger: 413 (gRPC: RESOURCE_EXHAUSTED)
    max_connections = 64            # HTTP connections at once (one more: 503, closed)
    idle_timeout_s = 5              # an idle keep-alive connection is closed after this
    request_timeout_s = 30          # a request's headers and body must be in by then (408)
    grpc_workers = 4                # gRPC calls running at once
    max_grpc_calls = 64             # gRPC calls running or waiting (more: RESOURCE_EXHAUSTED)

    [limits]                        # what one input may hold, wherever it enters (the local
                                    # API, infer, redact, streams); checked before it is
                                    # decoded or run, refused with a 400 naming the limit
    max_image_pixels = 40000000     # a picture's (each video frame's) width x height, read
                                    # from its header first
    max_video_frames = 216000       # frames of one video given to redact (2 h at 30 a second)
    max_request_rows = 32           # rows (the batch dimension) of one request

    [thermal]                       # the thermal and power control loop
    enabled = true
    interval_s = 5
    hysteresis_c = 5                # step back up only this far below the throttle point

    [logging]
    format = "json"                 # json (one object a line, with request ids) | text
    level = "info"

    [[streams]]                     # camera and video streams through the agent (any number)
    name = "door"                   # letters, digits, '.', '_', '-' (its metrics and topics)
    source = "/dev/video0"          # a video file, /dev/videoN, rtsp://... or http://...
    model = "face-detection-short-range"   # a model with image preprocessing
    label = "personal"              # the frames' sensitivity (public | personal | sensitive)
    rate = 5                        # frames a second taken (0: every frame the source gives)
    key_frames = 0                  # skip a frame that differs from the last inferred by less
                                    # than this (mean absolute difference, 0..255; 0: none)
    sink = "mqtt"                   # mqtt | sse | stdout | jsonl:PATH (one result a line)
    deadline_ms = 0                 # each frame's (0: the agent's deadline_ms)
    realtime = true                 # a file is read at its own frame rate, as a camera gives it
"""

from __future__ import annotations

import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edge_core.fields import Fields, Read, load_document, resolver
from edge_core.images import MAX_IMAGE_PIXELS, MAX_VIDEO_FRAMES
from edge_core.mqtt import MqttSettings, read_mqtt
from edge_core.paths import default_model_dir
from edge_core.tls import TLSSettings, read_tls

__all__ = [
    "AgentConfig",
    "ApiSettings",
    "BreakerSettings",
    "GatewaySettings",
    "LimitSettings",
    "LoggingSettings",
    "OtaSettings",
    "PrivacySettings",
    "StreamSettings",
    "TelemetrySettings",
    "ThermalSettings",
    "load_agent_config",
]

# Settings: one table of the file (a frozen dataclass whose defaults are the
# documented ones, read from here by the loader); Config: the whole file.

STATE_DIR = Path("/var/lib/edge-agent")


@dataclass(frozen=True)
class GatewaySettings:
    address: str  # the first of ``addresses``; empty for mqtt
    protocol: str = "grpc"
    token: str | None = None
    retries: int = 2
    tls: TLSSettings | None = None
    addresses: tuple[str, ...] = ()  # every replica (default: ``address`` alone)

    @property
    def replicas(self) -> tuple[str, ...]:
        return self.addresses or (self.address,)


@dataclass(frozen=True)
class OtaSettings:
    """How the updater reaches the gateway and paces itself.

    Attributes:
        bundle: the enrollment bundle (``cloud-gateway device add``).
        state_dir: where slots, partial downloads and trusted metadata live.
        url: the gateway's REST base URL (``None``: the bundle's).
        interval_s, jitter_s: the periodic check (a random 0..jitter is added).
        expiry_slack_s: accept metadata this long past its expiry (devices
            without a real-time clock boot into the past or the future).
        bandwidth: bytes per second for blob downloads (0: no cap).
        attempts: download attempts (each resumes where the last stopped).
        timeout_s: per read.
        min_rate: bytes per second that every download (blobs, key files and
            metadata) must average over each ``rate_window_s``; its deadline is
            ``rate_window_s`` plus its signed length (for metadata, python-tuf's
            maximum length) at ``min_rate``. A download that falls behind is
            abandoned, what arrived is kept, and the next check resumes it; so a
            server that drips bytes cannot hold the update lock (0: no minimum
            and no deadline). At most ``bandwidth`` when that is set.
        rate_window_s: the window of ``min_rate``, and the deadline's slack.
        max_model_bytes: a target whose signed blob or plaintext length is
            larger is refused before any byte is fetched (the plaintext is held
            in memory when the model is loaded).
        min_free_bytes: the free space a download must leave on the state
            directory's filesystem; one that would leave less is not started.
    """

    state_dir: Path
    bundle: Path | None = None
    url: str | None = None
    interval_s: float = 3600.0
    jitter_s: float = 300.0
    expiry_slack_s: float = 0.0
    bandwidth: int = 0
    attempts: int = 4
    timeout_s: float = 30.0
    min_rate: int = 4096
    rate_window_s: float = 60.0
    max_model_bytes: int = 2 << 30
    min_free_bytes: int = 64 << 20


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
    max_connections: int = 64
    idle_timeout_s: float = 5.0
    request_timeout_s: float = 30.0
    grpc_workers: int = 4
    max_grpc_calls: int = 64


@dataclass(frozen=True)
class LimitSettings:
    """What one input may hold, wherever it enters: a decoder allocates what a file's
    header says and a model what its rows need, so both are held to a limit first."""

    max_image_pixels: int = MAX_IMAGE_PIXELS
    max_video_frames: int = MAX_VIDEO_FRAMES
    max_request_rows: int = 32


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
class PrivacySettings:
    """The face detector (``None``: the device profile's choice, else the measured
    default of :mod:`edge_agent.privacy.faces`)."""

    face_detector: bool = True
    detector: str | None = None
    threshold: float | None = None
    scale: float | None = None
    check_threshold: float | None = None


@dataclass(frozen=True)
class StreamSettings:
    """One ``[[streams]]`` table: a camera or video through the agent."""

    name: str
    source: str  # a path (resolved against the file's folder), a device or a URL
    model: str
    label: str | None = None
    rate: float = 0.0
    key_frames: float = 0.0
    sink: str = "stdout"
    deadline_ms: float = 0.0
    realtime: bool = True


@dataclass(frozen=True)
class BreakerSettings:
    failures: int = 3
    cooldown_s: float = 5.0


@dataclass(frozen=True)
class AgentConfig:
    device_id: str = "edge-device"
    profile: str | None = None
    profiles_dir: Path | None = None
    root: Path = Path("/")
    model_dir: Path = field(default_factory=default_model_dir)
    policy: Path | None = None
    deadline_ms: float = 1000.0
    cache_entries: int = 256
    gateway: GatewaySettings | None = None
    breaker: BreakerSettings = field(default_factory=BreakerSettings)
    privacy: PrivacySettings = field(default_factory=PrivacySettings)
    ota: OtaSettings | None = None
    state_dir: Path = STATE_DIR
    mqtt: MqttSettings | None = None
    telemetry: TelemetrySettings | None = None
    api: ApiSettings = field(default_factory=ApiSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    thermal: ThermalSettings = field(default_factory=ThermalSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    streams: tuple[StreamSettings, ...] = ()
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


def load_agent_config(path: Path | None, *, reads: list[Read] | None = None) -> AgentConfig:
    """The configuration in ``path`` (the defaults when ``None``); each field the
    loader asks for is noted in ``reads`` when given (the reference page's source).

    Every relative path in the file is taken relative to the file's folder,
    once (whatever the current directory; a path the file does not give is
    absolute or built from one that was resolved).

    Raises:
        ConfigError: the file is missing or malformed, or a field is wrong.
    """
    if path is None:
        return AgentConfig()
    fields = Fields(load_document(path), path=path, reads=reads)
    resolve = resolver(path)

    defaults = AgentConfig()
    model_dir = fields.string("model_dir", None)
    profiles_dir = fields.string("profiles_dir", None)
    policy = fields.string("policy", None)
    state_dir = resolve(fields.string("state_dir", str(defaults.state_dir)))
    mqtt = _mqtt(fields, resolve)
    config = AgentConfig(
        device_id=fields.string("device_id", defaults.device_id),
        profile=fields.string("profile", None),
        profiles_dir=resolve(profiles_dir) if profiles_dir else None,
        root=resolve(fields.string("root", str(defaults.root))),
        model_dir=resolve(model_dir) if model_dir else defaults.model_dir,
        policy=resolve(policy) if policy else None,
        deadline_ms=fields.number("deadline_ms", defaults.deadline_ms, minimum=1.0),
        cache_entries=fields.integer("cache_entries", defaults.cache_entries, minimum=0),
        gateway=_gateway(fields, resolve),
        breaker=_breaker(fields.table("breaker", None)),
        privacy=_privacy(fields.table("privacy", None)),
        ota=_ota(fields, resolve, state_dir),
        state_dir=state_dir,
        mqtt=mqtt,
        telemetry=_telemetry(fields.table("telemetry", None), mqtt),
        api=_api(fields.table("api", None), resolve),
        limits=_limits(fields.table("limits", None)),
        thermal=_thermal(fields.table("thermal", None)),
        logging=_logging(fields.table("logging", None)),
        streams=_streams(fields, resolve),
        source=path,
    )
    fields.done()
    return config


def _gateway(fields: Fields, resolve: Callable[[str], Path]) -> GatewaySettings | None:
    if not fields.has("gateway"):
        return None
    g = fields.table("gateway")
    token = g.string("token", None)
    token_file = g.string("token_file", None)
    if token is not None and token_file is not None:
        raise g.fail("token", "give token or token_file, not both")
    if token_file is not None:
        token = _read_secret(resolve(token_file), g, "token_file")
    protocol = g.string("protocol", GatewaySettings.protocol, choices=["grpc", "http", "mqtt"])
    if protocol == "mqtt" and not fields.has("mqtt"):
        raise g.fail("protocol", "mqtt needs an [mqtt] section (the broker)")
    raw = g.raw("address", "" if protocol == "mqtt" else None)
    if isinstance(raw, list) and raw and all(isinstance(a, str) and a for a in raw):
        addresses = tuple(raw)
    elif isinstance(raw, str) and (raw or protocol == "mqtt"):
        addresses = (raw,)
    else:
        raise g.fail("address", 'expected "HOST:PORT" or a list of them (one per replica)')
    gateway = GatewaySettings(
        address=addresses[0],
        addresses=addresses,
        protocol=protocol,
        token=token,
        retries=g.integer("retries", GatewaySettings.retries, minimum=0),
        tls=read_tls(g, resolve),
    )
    g.done()
    return gateway


def _limits(f: Fields) -> LimitSettings:
    defaults = LimitSettings()
    limits = LimitSettings(
        max_image_pixels=f.integer("max_image_pixels", defaults.max_image_pixels, minimum=1),
        max_video_frames=f.integer("max_video_frames", defaults.max_video_frames, minimum=1),
        max_request_rows=f.integer("max_request_rows", defaults.max_request_rows, minimum=1),
    )
    f.done()
    return limits


def _breaker(b: Fields) -> BreakerSettings:
    defaults = BreakerSettings()
    breaker = BreakerSettings(
        failures=b.integer("failures", defaults.failures, minimum=1),
        cooldown_s=b.number("cooldown_s", defaults.cooldown_s, minimum=0.0),
    )
    b.done()
    return breaker


# the detectors edge_agent.privacy.faces knows (the configuration imports no feature)
DETECTORS = ("centerface", "blazeface", "blazeface+centerface")


def _privacy(p: Fields) -> PrivacySettings:
    def score(key: str) -> float | None:
        value: float | None = p.number(key, None, minimum=0.01, maximum=0.99)
        return value

    privacy = PrivacySettings(
        face_detector=p.boolean("face_detector", PrivacySettings.face_detector),
        detector=p.string("detector", None, choices=list(DETECTORS)),
        threshold=score("threshold"),
        scale=p.number("scale", None, minimum=0.25, maximum=2.0),
        check_threshold=score("check_threshold"),
    )
    p.done()
    return privacy


def _ota(fields: Fields, resolve: Callable[[str], Path], state_dir: Path) -> OtaSettings | None:
    if not fields.has("ota"):
        return None
    o = fields.table("ota")
    own_state = o.string("state_dir", None)
    defaults = OtaSettings(state_dir=state_dir)
    ota = OtaSettings(
        bundle=resolve(o.string("bundle")),
        state_dir=resolve(own_state) if own_state else state_dir,
        url=o.string("url", None),
        interval_s=o.number("interval_s", defaults.interval_s, minimum=1.0),
        jitter_s=o.number("jitter_s", defaults.jitter_s, minimum=0.0),
        expiry_slack_s=o.number("expiry_slack_s", defaults.expiry_slack_s, minimum=0.0),
        bandwidth=o.integer("bandwidth", defaults.bandwidth, minimum=0),
        attempts=o.integer("attempts", defaults.attempts, minimum=1),
        timeout_s=o.number("timeout_s", defaults.timeout_s, minimum=0.1),
        min_rate=o.integer("min_rate", defaults.min_rate, minimum=0),
        rate_window_s=o.number("rate_window_s", defaults.rate_window_s, minimum=0.1),
        max_model_bytes=o.integer("max_model_bytes", defaults.max_model_bytes, minimum=1),
        min_free_bytes=o.integer("min_free_bytes", defaults.min_free_bytes, minimum=0),
    )
    if ota.bandwidth and ota.min_rate > ota.bandwidth:
        # the cap would make every download fall below the minimum and be abandoned
        raise o.fail(
            "min_rate",
            f"expected at most bandwidth ({ota.bandwidth} bytes/s), got {ota.min_rate}",
        )
    o.done()
    return ota


def _mqtt(fields: Fields, resolve: Callable[[str], Path]) -> MqttSettings | None:
    if not fields.has("mqtt"):
        return None
    m = fields.table("mqtt")
    mqtt = read_mqtt(m, resolve)
    m.done()
    if mqtt.password_file is not None:
        password = _read_secret(mqtt.password_file, m, "password_file")
        mqtt = replace(mqtt, password=password)
    return mqtt


def _telemetry(t: Fields, mqtt: MqttSettings | None) -> TelemetrySettings | None:
    telemetry = None
    if t.boolean("enabled", mqtt is not None):
        if mqtt is None:
            raise t.fail("enabled", "telemetry needs an [mqtt] section (the broker)")
        defaults = TelemetrySettings()
        telemetry = TelemetrySettings(
            interval_s=t.number("interval_s", defaults.interval_s, minimum=0.1),
            max_messages=t.integer("max_messages", defaults.max_messages, minimum=1),
        )
    t.done()
    return telemetry


LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _api(a: Fields, resolve: Callable[[str], Path]) -> ApiSettings:
    defaults = ApiSettings()
    socket = a.string("socket", None)
    api = ApiSettings(
        host=a.string("host", defaults.host),
        http_port=a.integer("http_port", defaults.http_port, minimum=0, maximum=65535),
        grpc_port=a.integer("grpc_port", defaults.grpc_port, minimum=0, maximum=65535),
        socket=resolve(socket) if socket else None,
        allow_remote=a.boolean("allow_remote", defaults.allow_remote),
        drain_s=a.number("drain_s", defaults.drain_s, minimum=0.0),
        max_body_bytes=a.integer("max_body_bytes", defaults.max_body_bytes, minimum=1024),
        max_connections=a.integer("max_connections", defaults.max_connections, minimum=1),
        idle_timeout_s=a.number("idle_timeout_s", defaults.idle_timeout_s, minimum=0.1),
        request_timeout_s=a.number("request_timeout_s", defaults.request_timeout_s, minimum=0.1),
        grpc_workers=a.integer("grpc_workers", defaults.grpc_workers, minimum=1),
        max_grpc_calls=a.integer("max_grpc_calls", defaults.max_grpc_calls, minimum=1),
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
    defaults = ThermalSettings()
    thermal = ThermalSettings(
        enabled=t.boolean("enabled", defaults.enabled),
        interval_s=t.number("interval_s", defaults.interval_s, minimum=0.05),
        hysteresis_c=t.number("hysteresis_c", defaults.hysteresis_c, minimum=0.0),
    )
    t.done()
    return thermal


STREAM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SINKS = ("mqtt", "sse", "stdout")


def _streams(fields: Fields, resolve: Callable[[str], Path]) -> tuple[StreamSettings, ...]:
    streams: list[StreamSettings] = []
    for s in fields.tables("streams", []):
        name = s.string("name")
        if not STREAM_NAME.fullmatch(name):
            raise s.fail(
                "name", f"expected 1-64 letters, digits, '.', '_' or '-', got {name!r:.80}"
            )
        if name in {stream.name for stream in streams}:
            raise s.fail("name", f"a second stream is named {name!r}")
        source = s.string("source")
        if "://" not in source and not source.startswith("/dev/"):
            source = str(resolve(source))  # a file, relative to this one
        sink = s.string("sink", StreamSettings.sink)
        if sink not in SINKS and not sink.startswith("jsonl:"):
            raise s.fail("sink", f"expected one of {', '.join(SINKS)} or jsonl:PATH, got {sink!r}")
        if sink.startswith("jsonl:"):
            sink = "jsonl:" + str(resolve(sink.removeprefix("jsonl:")))
        defaults = StreamSettings(name=name, source=source, model="")
        streams.append(
            StreamSettings(
                name=name,
                source=source,
                model=s.string("model"),
                label=s.string("label", None, choices=["public", "personal", "sensitive"]),
                rate=s.number("rate", defaults.rate, minimum=0.0),
                key_frames=s.number("key_frames", defaults.key_frames, minimum=0.0, maximum=255),
                sink=sink,
                deadline_ms=s.number("deadline_ms", defaults.deadline_ms, minimum=0.0),
                realtime=s.boolean("realtime", defaults.realtime),
            )
        )
        s.done()
    return tuple(streams)


def _logging(g: Fields) -> LoggingSettings:
    defaults = LoggingSettings()
    settings = LoggingSettings(
        format=g.string("format", defaults.format, choices=["json", "text"]),
        level=g.string("level", defaults.level, choices=["debug", "info", "warning", "error"]),
    )
    g.done()
    return settings
