"""The gateway's one configuration object, loaded and validated in one place.

A TOML file (every field optional but ``repository``; command-line flags override
it), relative paths relative to the file's folder. Each table is a settings class
below, whose ``Attributes:`` name the table's fields as the file spells them;
``tools/config_reference.py`` makes the operators' reference
(docs/reference/gateway.md) from them and from what the loader reads, so a field
documented nowhere fails ``make docs``.

A wrong field fails at start with the file, the field and what was expected.
docs/limits.md lists every limit and timeout with what happens
when it is hit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from dataclasses import fields as fields_of
from pathlib import Path
from typing import Any

from cloud_gateway import cpus
from edge_core.errors import ConfigError
from edge_core.fields import Fields, Read, load_document, resolver
from edge_core.mqtt import MqttSettings, read_mqtt
from edge_core.names import MODEL_NAME_RULE, is_model_name
from edge_core.package import FORMATS, PRECISIONS
from edge_core.runtime import RuntimeOptions
from edge_core.tls import TLSSettings, read_tls

__all__ = [
    "BackendSettings",
    "BatchingSettings",
    "ConnectionSettings",
    "DashboardSettings",
    "GatewayConfig",
    "MqttBridgeSettings",
    "Overrides",
    "RateLimitSettings",
    "ServerTLSSettings",
    "load_config",
]

DEFAULT_STATE_FILE = "gateway.sqlite"  # in state_dir, when no `state` URL is given
GATEWAY_MQTT_USER = "_gateway"  # a device id cannot start with "_": no device can take it


@dataclass(frozen=True)
class BatchingSettings:
    """Dynamic batching, for every model with a dynamic batch dimension.

    Attributes:
        enabled: batch requests together.
        max_batch_size: rows of one batch at most.
        max_queue_delay_us: an added wait for a fuller batch (0: none; what arrived
            during the last run goes together).
        preferred_batch_sizes: batch sizes to cut at, from 1 to ``max_batch_size``.
        busy_delay_us: a wait only while the model is congested (the last batch
            held several requests and this one came while a batch ran); it ends at
            twice the last batch's rows (up to 16), or all the model held lately if
            fewer: a lone client never waits.
    """

    enabled: bool = True
    max_batch_size: int = 32
    max_queue_delay_us: int = 0  # 0: no added wait; what arrived during the last run goes together
    preferred_batch_sizes: tuple[int, ...] = ()
    # a wait for a fuller batch only while the model is busy (its last batch held several
    # requests), and only until the batch is as full as that one: a lone client never waits
    busy_delay_us: int = 0


@dataclass(frozen=True)
class RateLimitSettings:
    """A rate limit per device (a token bucket), over every front end.

    Attributes:
        requests_per_second: the sustained rate (0: unlimited).
        burst: requests allowed at once above the rate.
    """

    requests_per_second: float = 0.0
    burst: int = 0

    @property
    def enabled(self) -> bool:
        return self.requests_per_second > 0


@dataclass(frozen=True)
class ConnectionSettings:
    """Limits and timeouts of client connections (what happens when one is hit:
    docs/limits.md).

    Attributes:
        max_connections: per front end, lowered to a third of what the descriptor
            limit leaves (``(RLIMIT_NOFILE - 64) // 3``). REST: one more closes the
            longest-waiting idle connection, or is answered 503 when all are busy;
            gRPC: refused.
        header_timeout_s: REST: from a request's first byte to the end of its
            headers (408); gRPC: the TLS and HTTP/2 handshake.
        max_header_bytes: REST: the request line and headers (431).
        body_timeout_s: REST: from the end of the headers to the end of the body (408).
        keep_alive_timeout_s: REST: a connection waiting for a request, fresh or
            answered, is closed after this.
        grpc_idle_timeout_s: gRPC: a connection without a call this long gets GOAWAY.
        grpc_max_connection_age_s: gRPC: a connection this old gets GOAWAY (the
            client reconnects).
        grpc_max_connection_age_grace_s: gRPC: how long its calls may still run then.
        grpc_max_concurrent_streams: gRPC: calls one connection holds at once,
            counted until the gateway has released them (not until their answer
            left), so it is set well above the calls one client process keeps open;
            past it, refused.
    """

    max_connections: int = 1000
    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024
    body_timeout_s: float = 60.0
    keep_alive_timeout_s: float = 5.0
    grpc_idle_timeout_s: float = 300.0
    grpc_max_connection_age_s: float = 1800.0
    grpc_max_connection_age_grace_s: float = 30.0
    grpc_max_concurrent_streams: int = 1000


@dataclass(frozen=True)
class DashboardSettings:
    """The fleet dashboard: pages under ``/ui``, its JSON API under ``/api``, for
    admin tokens.

    Attributes:
        enabled: serve it.
        history_hours: how long each device's history (a point a minute) is kept.
        session_idle_s: a sign-in unused this long ends.
        session_max_s: and any sign-in after this long.
        max_sessions: sign-ins at once (past it the least recently used ends; an
            admin keeps at most 10).
        refresh_s: how often an open page asks for what changed.
    """

    enabled: bool = True
    history_hours: float = 24.0
    session_idle_s: float = 1800.0
    session_max_s: float = 43200.0
    max_sessions: int = 100
    refresh_s: float = 2.0


@dataclass(frozen=True)
class ServerTLSSettings:
    """TLS on both front ends; without this table, none.

    Attributes:
        cert: the server's certificate (PEM).
        key: its private key (PEM).
        client_ca: gRPC: verify client certificates against this CA.
        require_client_cert: gRPC: refuse a client without one (needs ``client_ca``).
    """

    cert: Path
    key: Path
    client_ca: Path | None = None
    require_client_cert: bool = False


@dataclass(frozen=True)
class MqttBridgeSettings(MqttSettings):
    """The MQTT bridge (offload over MQTT, announcements) and its broker, as the
    agent's ``[mqtt]`` has it, with the gateway's own defaults; without this table,
    none.

    Attributes:
        username: the gateway's user name (``cloud-gateway mqtt acl`` writes it into
            the broker's files).
        password_file (default: ``mqtt-gateway.password`` in ``state_dir``): a file
            holding its password (mode 0600; made by ``cloud-gateway mqtt acl``).
        announce_interval_s: how often rollouts are checked for changes to announce.
    """

    username: str | None = GATEWAY_MQTT_USER
    announce_interval_s: float = 2.0


@dataclass(frozen=True)
class BackendSettings:
    """A remote Open Inference Protocol engine (Triton, KServe, MLServer, another
    cloud-gateway) that runs models for the gateway: they are forwarded to it, never
    batched or run here. None: every model runs in this process.

    Attributes:
        url: ``grpc://``, ``grpcs://`` (TLS), ``http://`` or ``https://`` and
            ``HOST:PORT``.
        name (default: the ``url``): in logs, metrics and readiness.
        models ("all" or a list of model names): the models it runs; ``"all"``:
            what its repository index lists as ready.
        timeout_s: a request without a deadline of its own.
        connect_timeout_s: a connection to the engine.
        max_in_flight: requests out to the engine at once; more wait within their
            deadline, then 503.
        health_interval_s: how often its readiness is checked.
        token_file: a token sent as ``Authorization: Bearer`` (mode 0600).
        forward_parameters: the devices' request parameters sent on to the engine
            (none by default: the engine trusts the gateway, not every device).
    """

    url: str
    protocol: str  # grpc | http, from the URL's scheme
    address: str  # host:port (gRPC) or the base URL (HTTP)
    name: str = ""
    models: tuple[str, ...] | None = None
    timeout_s: float = 30.0
    connect_timeout_s: float = 2.0
    max_in_flight: int = 64
    health_interval_s: float = 1.0
    token_file: Path | None = None
    tls: TLSSettings | None = None
    # a device's request parameters sent on to the engine (the gateway sets the deadline
    # itself); none by default: the engine trusts the gateway, not every device
    forward_parameters: tuple[str, ...] = ()


_SCHEMES = {"grpc": ("grpc", False), "grpcs": ("grpc", True), "http": ("http", False)}
_SCHEMES["https"] = ("http", True)


def _backend(b: Fields, resolve: Callable[[str], Path]) -> BackendSettings:
    url = b.string("url")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in _SCHEMES or not rest.strip("/"):
        expected = "grpc://, grpcs://, http:// or https://HOST:PORT"
        raise b.fail("url", f"expected {expected}, got {url!r}")
    protocol, secure = _SCHEMES[scheme]
    tls = read_tls(b, resolve)
    if secure and tls is None:
        tls = TLSSettings()  # the system's CAs
    if tls is not None and not secure:
        raise b.fail("tls", f"a [tls] table needs grpcs:// or https://, not {scheme}://")
    models: Any = b.raw("models", "all")
    if models == "all":
        names = None
    elif isinstance(models, list) and models and all(is_model_name(m) for m in models):
        names = tuple(models)
    else:
        raise b.fail("models", f'expected "all" or a list of model names ({MODEL_NAME_RULE})')
    token_file = b.string("token_file", None)
    default = BackendSettings(url="", protocol="", address="")
    settings = BackendSettings(
        url=url,
        protocol=protocol,
        address=rest.rstrip("/") if protocol == "grpc" else url.rstrip("/"),
        name=b.string("name", url),
        models=names,
        timeout_s=b.number("timeout_s", default.timeout_s, minimum=0.001),
        connect_timeout_s=b.number("connect_timeout_s", default.connect_timeout_s, minimum=0.001),
        max_in_flight=b.integer("max_in_flight", default.max_in_flight, minimum=1),
        health_interval_s=b.number("health_interval_s", default.health_interval_s, minimum=0.05),
        token_file=resolve(token_file) if token_file else None,
        tls=tls,
        forward_parameters=tuple(b.str_list("forward_parameters", [])),
    )
    b.done()
    return settings


def _state(fields: Fields) -> str | None:
    url: str | None = fields.string("state", None)
    if url is not None and not url.startswith(("sqlite:///", "postgresql://", "postgresql+")):
        raise fields.fail("state", f"expected sqlite:///FILE or postgresql://..., got {url[:40]!r}")
    return url


@dataclass(frozen=True)
class Overrides:
    """What the command line sets over the file (``None``: the file's value)."""

    repository: Path | None = None
    state_dir: Path | None = None
    state: str | None = None
    host: str | None = None
    http_port: int | None = None
    grpc_port: int | None = None


@dataclass(frozen=True)
class GatewayConfig:
    """The gateway's file (``cloud-gateway --config gateway.toml serve``).

    Attributes:
        repository: the model repository (required here or as ``--repository``).
        state_dir: group keys, enrollment bundles, the embedded database.
        state (default: ``sqlite:///<state_dir>/gateway.sqlite``): the state
            database that replicas share (``sqlite:///FILE`` or
            ``postgresql://...``): devices (hashed tokens), groups, revocations,
            rollouts, reports.
        host: the address both front ends listen on.
        http_port: REST.
        grpc_port: gRPC.
        ota_repository: the signed update repository served to devices.
        poll_interval_s: how often the repository is checked for changes.
        max_body_bytes: larger requests: 413 / RESOURCE_EXHAUSTED.
        workers: inference threads.
        threads (default: the cores, or one per ``inference_cpus`` core): ONNX
            Runtime intra-op threads per inference.
        inference_cpus (a list of integers; default: every thread on every core):
            run inference on these cores only, the front ends on the others (Linux).
        spinning: let ONNX Runtime's idle threads spin.
        providers: ONNX Runtime execution providers, in order of preference.
        precisions: which variant of a model it loads: the precisions it prefers,
            in order.
        formats: and the formats, in order.
        metrics: the Prometheus metrics at ``/metrics``.
        metrics.public: ``/metrics`` without a token, less the series naming a
            device or a group (those need an admin or metrics token).
        models.MODEL.batching: a model's own ``[batching]`` (``MODEL``: its name),
            each field defaulting to ``[batching]``'s.
    """

    repository: Path
    state_dir: Path = Path("gateway-state")
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    poll_interval_s: float = 2.0
    max_body_bytes: int = 64 * 1024 * 1024
    workers: int = 2
    inference_cpus: tuple[int, ...] | None = None  # see cloud_gateway.cpus
    # Spinning threads would take CPU from the front ends on the same cores.
    runtime: RuntimeOptions = field(
        default_factory=lambda: RuntimeOptions(threads=None, warmup=3, allow_spinning=False)
    )
    precisions: tuple[str, ...] = ("fp32", "int8", "fp16")
    formats: tuple[str, ...] = ("onnx", "tflite")
    tls: ServerTLSSettings | None = None
    rate_limit: RateLimitSettings = field(default_factory=RateLimitSettings)
    batching: BatchingSettings = field(default_factory=BatchingSettings)
    model_batching: dict[str, BatchingSettings] = field(default_factory=dict)
    metrics_public: bool = False
    connections: ConnectionSettings = field(default_factory=ConnectionSettings)
    ota_repository: Path | None = None
    mqtt: MqttBridgeSettings | None = None
    backends: tuple[BackendSettings, ...] = ()
    dashboard: DashboardSettings = field(default_factory=DashboardSettings)
    state: str | None = None  # the state database's URL (None: the embedded one)
    source: Path | None = None

    @property
    def state_url(self) -> str:
        """The state database: ``state``, else SQLite in the state directory."""
        return self.state or f"sqlite:///{Path(self.state_dir).resolve() / DEFAULT_STATE_FILE}"

    @property
    def mqtt_password_file(self) -> Path:
        """The gateway's own password on the broker (made by ``cloud-gateway mqtt acl``)."""
        if self.mqtt is not None and self.mqtt.password_file is not None:
            return self.mqtt.password_file
        return self.state_dir / "mqtt-gateway.password"

    def batching_for(self, model: str) -> BatchingSettings:
        return self.model_batching.get(model, self.batching)

    def overridden(self, overrides: Overrides) -> GatewayConfig:
        """A copy with the fields ``overrides`` sets replaced."""
        changes = {f.name: getattr(overrides, f.name) for f in fields_of(overrides)}
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def _batching(fields: Fields, base: BatchingSettings) -> BatchingSettings:
    config = BatchingSettings(
        enabled=fields.boolean("enabled", base.enabled),
        max_batch_size=fields.integer("max_batch_size", base.max_batch_size, minimum=1),
        max_queue_delay_us=fields.integer("max_queue_delay_us", base.max_queue_delay_us, minimum=0),
        preferred_batch_sizes=tuple(
            fields.int_list("preferred_batch_sizes", list(base.preferred_batch_sizes))
        ),
        busy_delay_us=fields.integer("busy_delay_us", base.busy_delay_us, minimum=0),
    )
    for size in config.preferred_batch_sizes:
        if not 1 <= size <= config.max_batch_size:
            raise fields.fail(
                "preferred_batch_sizes",
                f"expected sizes from 1 to max_batch_size ({config.max_batch_size}), got {size}",
            )
    fields.done()
    return config


def _connections(fields: Fields) -> ConnectionSettings:
    base = ConnectionSettings()

    def seconds(key: str) -> float:
        return float(fields.number(key, getattr(base, key), minimum=0.001))

    config = ConnectionSettings(
        max_connections=fields.integer("max_connections", base.max_connections, minimum=1),
        header_timeout_s=seconds("header_timeout_s"),
        max_header_bytes=fields.integer("max_header_bytes", base.max_header_bytes, minimum=1024),
        body_timeout_s=seconds("body_timeout_s"),
        keep_alive_timeout_s=seconds("keep_alive_timeout_s"),
        grpc_idle_timeout_s=seconds("grpc_idle_timeout_s"),
        grpc_max_connection_age_s=seconds("grpc_max_connection_age_s"),
        grpc_max_connection_age_grace_s=seconds("grpc_max_connection_age_grace_s"),
        grpc_max_concurrent_streams=fields.integer(
            "grpc_max_concurrent_streams", base.grpc_max_concurrent_streams, minimum=1
        ),
    )
    fields.done()
    return config


def _dashboard(fields: Fields) -> DashboardSettings:
    base = DashboardSettings()
    config = DashboardSettings(
        enabled=fields.boolean("enabled", base.enabled),
        history_hours=fields.number("history_hours", base.history_hours, minimum=0.1),
        session_idle_s=fields.number("session_idle_s", base.session_idle_s, minimum=10.0),
        session_max_s=fields.number("session_max_s", base.session_max_s, minimum=10.0),
        max_sessions=fields.integer("max_sessions", base.max_sessions, minimum=1),
        refresh_s=fields.number("refresh_s", base.refresh_s, minimum=0.5),
    )
    fields.done()
    return config


def _runtime(fields: Fields, base: RuntimeOptions) -> tuple[tuple[int, ...] | None, RuntimeOptions]:
    """The cores inference is pinned to, if any, and the runtime's options: one runtime
    thread per pinned core unless ``threads`` says otherwise."""
    threads = fields.integer("threads", base.threads, minimum=1)
    inference_cpus = None
    if fields.has("inference_cpus"):
        try:
            inference_cpus = tuple(sorted(cpus.check(fields.int_list("inference_cpus"))))
        except ConfigError as exc:
            raise fields.fail("inference_cpus", str(exc)) from None
        threads = threads if fields.has("threads") else len(inference_cpus)
    spinning = fields.boolean("spinning", base.allow_spinning)
    providers = tuple(fields.str_list("providers", list(base.providers)))
    runtime = replace(base, threads=threads, providers=providers, allow_spinning=spinning)
    return inference_cpus, runtime


def _tls(fields: Fields, resolve: Callable[[str], Path]) -> ServerTLSSettings | None:
    """``[tls]``, if given; a client CA is required when client certificates are."""
    tls_fields = fields.table("tls", None)
    if not fields.has("tls"):
        return None
    client_ca = tls_fields.string("client_ca", None)
    tls = ServerTLSSettings(
        cert=resolve(tls_fields.string("cert")),
        key=resolve(tls_fields.string("key")),
        client_ca=resolve(client_ca) if client_ca else None,
        require_client_cert=tls_fields.boolean("require_client_cert", False),
    )
    if tls.require_client_cert and tls.client_ca is None:
        raise tls_fields.fail("client_ca", "required when require_client_cert is true")
    tls_fields.done()
    return tls


def _rate_limit(rate: Fields) -> RateLimitSettings:
    config = RateLimitSettings(
        requests_per_second=rate.number("requests_per_second", 0.0, minimum=0.0),
        burst=rate.integer("burst", 0, minimum=0),
    )
    rate.done()
    return config


def _model_batching(models: Fields, batching: BatchingSettings) -> dict[str, BatchingSettings]:
    """``[models.NAME.batching]``: a model's batching, over the gateway's."""
    model_batching = {}
    for name in models.names():
        model = models.table(name)
        model_batching[name] = _batching(model.table("batching", None), batching)
        model.done()
    models.done()
    return model_batching


def _mqtt_bridge(m: Fields, resolve: Callable[[str], Path]) -> MqttBridgeSettings:
    """``[mqtt]``: the fleet's broker as every MQTT client reads it, and how often the
    gateway announces its models there."""
    shared = read_mqtt(m, resolve, username=GATEWAY_MQTT_USER)
    mqtt = MqttBridgeSettings(
        **{f.name: getattr(shared, f.name) for f in fields_of(shared)},
        announce_interval_s=m.number(
            "announce_interval_s", MqttBridgeSettings.announce_interval_s, minimum=0.1
        ),
    )
    m.done()
    return mqtt


def load_config(
    path: Path | None, overrides: Overrides | None = None, *, reads: list[Read] | None = None
) -> GatewayConfig:
    """The configuration in ``path`` (or the defaults when ``None``), with the
    command line's ``overrides`` over it; each field the loader asks for is noted in
    ``reads`` when given (the reference page's source).

    Raises:
        ConfigError: the file is missing or malformed, a field is wrong, or
            no model repository is given.
    """
    overrides = overrides or Overrides()
    if path is None:
        if overrides.repository is None:
            raise ConfigError("no model repository given (--repository DIR or a config file)")
        return GatewayConfig(repository=overrides.repository).overridden(overrides)
    fields = Fields(load_document(path), path=path, reads=reads)
    resolve = resolver(path)

    default = GatewayConfig(repository=Path("."))
    repository = fields.string("repository", None)
    if repository is None and overrides.repository is None:
        raise fields.fail("repository", "missing (required, or give --repository)")
    inference_cpus, runtime = _runtime(fields, default.runtime)
    tls = _tls(fields, resolve)
    rate_limit = _rate_limit(fields.table("rate_limit", None))
    batching = _batching(fields.table("batching", None), default.batching)
    model_batching = _model_batching(fields.table("models", None), batching)
    ota_repository = fields.string("ota_repository", None)
    metrics = fields.table("metrics", None)
    metrics_public = metrics.boolean("public", False)
    metrics.done()
    mqtt = _mqtt_bridge(fields.table("mqtt"), resolve) if fields.has("mqtt") else None
    config = GatewayConfig(
        repository=resolve(repository) if repository else Path("."),
        state_dir=resolve(fields.string("state_dir", str(default.state_dir))),
        host=fields.string("host", default.host),
        http_port=fields.integer("http_port", default.http_port, minimum=0),
        grpc_port=fields.integer("grpc_port", default.grpc_port, minimum=0),
        poll_interval_s=fields.number("poll_interval_s", default.poll_interval_s, minimum=0.0),
        max_body_bytes=fields.integer("max_body_bytes", default.max_body_bytes, minimum=1024),
        workers=fields.integer("workers", default.workers, minimum=1),
        inference_cpus=inference_cpus,
        runtime=runtime,
        precisions=tuple(
            fields.str_list("precisions", list(default.precisions), choices=PRECISIONS)
        ),
        formats=tuple(fields.str_list("formats", list(default.formats), choices=FORMATS)),
        tls=tls,
        rate_limit=rate_limit,
        batching=batching,
        model_batching=model_batching,
        metrics_public=metrics_public,
        connections=_connections(fields.table("connections", None)),
        ota_repository=resolve(ota_repository) if ota_repository else None,
        mqtt=mqtt,
        backends=tuple(_backend(b, resolve) for b in fields.tables("backends", [])),
        dashboard=_dashboard(fields.table("dashboard", None)),
        state=_state(fields),
        source=path,
    )
    fields.done()
    return config.overridden(overrides)
