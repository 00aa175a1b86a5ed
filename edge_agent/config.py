"""The agent's one configuration object, loaded and validated in one place.

A TOML file; every field is optional (without a file: the detected profile,
the bundled models, local only), and relative paths are relative to the
file's folder. Each table is a settings class below, whose ``Attributes:``
name the table's fields as the file spells them; ``tools/config_reference.py``
makes the operators' reference (docs/reference/agent.md) from them and from
what the loader reads, so a field documented nowhere fails ``make docs``.

(Over 400 lines: the settings document every field of the file, and the
readers of the tables stay beside the settings they fill.)
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
    """Offload to the cloud gateway; without this table the agent answers locally.

    Attributes:
        address (a string or a list of strings): the gateway's ``HOST:PORT``, or a
            list of replicas (``["gw-a:8001", "gw-b:8001"]``): round robin, and a
            request that cannot reach one goes to the next within its deadline.
            Required, but for ``mqtt`` (requests go through the broker).
        protocol: how requests travel to the gateway.
        token: the device's token, written here (``token_file`` is better).
        token_file (default: the ``[ota]`` bundle's token): a file holding the
            device's token, readable by its owner alone (mode 0600); not with
            ``token``.
        retries: tries again, after a jittered doubling pause within the deadline,
            when the gateway was unavailable (a timeout or a refusal is not retried).
    """

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
    """Over-the-air model updates: how the updater reaches the gateway and paces
    itself; without this table, none.

    Attributes:
        bundle: the enrollment bundle (``cloud-gateway device add``; mode 0600):
            its token, group key, trusted root and gateway URL.
        state_dir (default: the top-level ``state_dir``): where slots, partial
            downloads and trusted metadata live.
        url (default: the bundle's): the gateway's REST base URL.
        interval_s: the periodic check, plus up to ``jitter_s`` at random.
        jitter_s: the random part of the check's period.
        expiry_slack_s: accept metadata this long past its expiry (devices
            without a real-time clock boot into the past or the future).
        bandwidth: bytes per second for blob downloads (0: no cap).
        attempts: download attempts per check (each resumes where the last stopped).
        timeout_s: per read of a download.
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
    """Status, decisions and latency sent to the fleet's broker, queued on disk
    while it is away.

    Attributes:
        enabled (default: true when there is an ``[mqtt]`` table): send it (it
            needs ``[mqtt]``).
        interval_s: how often.
        max_messages: the on-disk queue's bound (the oldest unsent are dropped,
            and counted).
    """

    interval_s: float = 30.0
    max_messages: int = 10_000


@dataclass(frozen=True)
class ApiSettings:
    """The local inference API of ``edge-agent run`` (the Open Inference Protocol
    over HTTP and gRPC).

    Attributes:
        host: where it listens: loopback only unless ``allow_remote`` (the API has
            no authentication).
        http_port: 0: no HTTP.
        grpc_port: 0: no gRPC.
        socket: HTTP on this Unix socket instead of ``host:http_port``.
        allow_remote: serve on an address other than loopback.
        drain_s: on SIGTERM, how long requests in flight may take.
        max_body_bytes: a larger request is answered 413 (gRPC: RESOURCE_EXHAUSTED).
        max_connections: HTTP connections at once (one more: 503, closed).
        idle_timeout_s: an idle keep-alive connection is closed after this.
        request_timeout_s: a request's headers and body must be in by then (408).
        grpc_workers: gRPC calls running at once.
        max_grpc_calls: gRPC calls running or waiting (more: RESOURCE_EXHAUSTED).
    """

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
    header says and a model what its rows need, so both are held to a limit first.

    Checked before an input is decoded or run (the local API, ``infer``, ``redact``,
    streams), and refused with a 400 naming the limit.

    Attributes:
        max_image_pixels: a picture's (each video frame's) width x height, read from
            its header first.
        max_video_frames: frames of one video given to ``redact``.
        max_request_rows: rows (the batch dimension) of one request.
    """

    max_image_pixels: int = MAX_IMAGE_PIXELS
    max_video_frames: int = MAX_VIDEO_FRAMES
    max_request_rows: int = 32


@dataclass(frozen=True)
class ThermalSettings:
    """The thermal and power control loop: the profile's power modes, stepped down
    as the device heats up.

    Attributes:
        enabled: run the loop.
        interval_s: how often temperatures are read.
        hysteresis_c: step back up only this far below the throttle point.
    """

    enabled: bool = True
    interval_s: float = 5.0
    hysteresis_c: float = 5.0


@dataclass(frozen=True)
class LoggingSettings:
    """The agent's log, on standard error (the journal under systemd).

    Attributes:
        format: ``json``: one object a line, with request ids; ``text``: for people.
        level: the least severe level written.
    """

    format: str = "json"
    level: str = "info"


@dataclass(frozen=True)
class PrivacySettings:
    """The face detector that looks for faces in pictures before they leave (unset
    fields: the device profile's choice, else the measured default of
    :mod:`edge_agent.privacy.faces`).

    Attributes:
        face_detector: search pictures for faces (needs the detector's package).
        detector (default: the profile's ``[privacy]`` detector, else
            ``centerface``): which detector.
        threshold (default: the detector's measured one): the lowest score kept.
        scale (default: the profile's, else 1): CenterFace's input scale.
        check_threshold (default: the detector's measured one): the stronger eye a
            redacted picture must pass before it leaves.
    """

    face_detector: bool = True
    detector: str | None = None
    threshold: float | None = None
    scale: float | None = None
    check_threshold: float | None = None


@dataclass(frozen=True)
class StreamSettings:
    """One ``[[streams]]`` table: a camera or video through the agent (any number).

    Attributes:
        name: letters, digits, ``.``, ``_``, ``-`` (at most 64; its metrics and topics).
        source: a video file (relative to this file), ``/dev/videoN``,
            ``rtsp://...`` or ``http://...``.
        model: a model with image preprocessing.
        label (default: none, as a request without one): the frames' sensitivity.
        rate: frames a second taken (0: every frame the source gives).
        key_frames: skip a frame that differs from the last inferred by less than
            this (mean absolute difference, 0 to 255; 0: none).
        sink: ``mqtt``, ``sse``, ``stdout`` or ``jsonl:PATH`` (one result a line).
        deadline_ms (default: the agent's ``deadline_ms``): each frame's deadline
            (0: the default).
        realtime: a file is read at its own frame rate, as a camera gives it.
    """

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
    """The circuit breaker in front of the gateway: after ``failures`` in a row,
    requests do not wait on a dead link for ``cooldown_s``, then one probe goes.

    Attributes:
        failures: consecutive failures (unavailable, timed out) that open it.
        cooldown_s: how long it stays open before a probe.
    """

    failures: int = 3
    cooldown_s: float = 5.0


@dataclass(frozen=True)
class AgentConfig:
    """The agent's file (``edge-agent run --config agent.toml``).

    Attributes:
        device_id: the device's name on the broker and in its telemetry (with an
            ``[ota]`` bundle: the bundle's, which another name may not contradict).
        profile (default: detected from the hardware): the device profile.
        profiles_dir (default: the bundled profiles): a folder of device profiles.
        root: the filesystem root under which the profile is detected and
            temperatures and power modes are read and written (a fake root
            simulates a device).
        model_dir (default: the models shipped with the agent): the model
            repository the device serves from, a folder of ``<name>/<version>/``
            packages (``edge-agent models install`` adds one); versions installed
            over the air (``[ota]``) come first, and the shipped face detectors stay
            beneath it.
        policy (default: the built-in policy): the offload policy file.
        deadline_ms: a request's deadline unless it brings its own.
        cache_entries: answers kept for the cached fallback tier.
        state_dir: where the agent writes: the telemetry queue, the OTA slots.
    """

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
