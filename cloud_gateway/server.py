"""The gateway process: one event loop serving REST (uvicorn), gRPC (grpc.aio)
and, when configured, the MQTT bridge.

:class:`Gateway` builds the parts from one :class:`GatewayConfig` (the backend
is injectable), loads the repository, starts both front ends and re-scans the
repository every ``poll_interval_s``. :class:`GatewayThread` runs one in a
background thread, for programs that embed it (the benchmark, the tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import signal
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

import grpc
import uvicorn

from cloud_gateway import cpus
from cloud_gateway.access import Access
from cloud_gateway.auth import DeviceRegistry
from cloud_gateway.config import GatewayConfig, ServerTLSSettings
from cloud_gateway.dashboard.actions import Operations
from cloud_gateway.dashboard.context import DashboardContext
from cloud_gateway.dashboard.sessions import Sessions
from cloud_gateway.dataplane import DataPlane
from cloud_gateway.fleet.ingest import TelemetryIngest
from cloud_gateway.fleet.store import FleetStore
from cloud_gateway.fleet.views import FleetViews
from cloud_gateway.grpc.servicer import InferenceServicer, add_to_server
from cloud_gateway.metrics import GatewayMetrics
from cloud_gateway.mqtt.bridge import MqttBridge
from cloud_gateway.ota.rollouts import Rollout, RolloutStore
from cloud_gateway.ota.service import OtaService
from cloud_gateway.remote.backend import RemoteBackend
from cloud_gateway.repository import Backend, EmbeddedBackend, ServingRepository
from cloud_gateway.rest.app import create_app
from cloud_gateway.rest.connections import (
    RESERVED_DESCRIPTORS,
    ConnectionTracker,
    Listener,
    ThrottleFilter,
    connection_cap,
    install_exhaustion_handler,
    raise_descriptor_limit,
)
from cloud_gateway.rest.direct import direct_protocol_class
from cloud_gateway.rest.infer import InferFront
from cloud_gateway.state import StateDatabase, upgrade
from edge_core.errors import ConfigError
from edge_core.loops import loop_kind, new_event_loop
from edge_core.memory import TRIM_INTERVAL_S, HeapTrimmer

__all__ = ["Gateway", "GatewayThread"]

log = logging.getLogger(__name__)


# uvicorn's lines that any client can cause, as often as it likes
_CLIENT_CAUSED = (
    "Invalid HTTP request received.",
    "Unsupported upgrade request.",
    "No supported WebSocket library detected.",
)


def _bind(host: str, port: int) -> Listener:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say
    # they are TCP, and without it every response waits ~40 ms for a delayed ACK.
    sock = Listener(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _port_error(
    field: str, front: str, host: str, port: int, exc: BaseException | None
) -> ConfigError:
    """A port that cannot be bound, said in one line: which, who may hold it, the fix."""
    why = getattr(exc, "strerror", None) or "it is in use, or not allowed here"
    flag = "--" + field.replace("_", "-")
    return ConfigError(
        f"cannot listen on {host}:{port} for {front}: {why} (another cloud-gateway? "
        f"`ss -ltnp 'sport = :{port}'` says who holds it); choose another port with "
        f"{flag} or {field} in the configuration",
        field=field,
    )


# how often what devices were heard from is written (one statement a kind, for them all)
HEARD_INTERVAL_S = 1.0
TELEMETRY_INTERVAL_S = 1.0  # how often the telemetry taken is written (one batch)
# grpc's own limits on calls accepted and not yet taken (the floor of ours)
PENDING_SOFT, PENDING_HARD = 1000, 3000
PRUNE_INTERVAL_S = 60.0  # how often the history past its hours, old sign-ins and reports go


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _pending_call_limits(streams: int) -> list[tuple[str, int]]:
    """grpc's limits on calls it accepted that the gateway has not yet taken: past the
    soft one it drops new calls at random, past the hard one all (CANCELLED).

    A connection counts a call against its stream limit until the gateway released it,
    so one connection, however it abuses its streams, holds at most ``streams`` pending
    calls: the soft limit is twice that, the hard one four times, and only several
    connections at their limit make grpc shed. At grpc's own 1000 and 3000, one
    rapid-reset connection at a limit of 1000 kept the queue at the soft limit, and
    honest clients on other connections lost a call in a few hundred. Never below
    grpc's own: the queue is shared by every connection, and a low stream limit with
    many devices (each a connection) must not shed their calls."""
    return [
        ("grpc.server.max_pending_requests", max(PENDING_SOFT, 2 * streams)),
        ("grpc.server.max_pending_requests_hard_limit", max(PENDING_HARD, 4 * streams)),
    ]


def _uvicorn_tls(tls: ServerTLSSettings | None) -> dict[str, Any]:
    """uvicorn's settings for the REST front end's TLS (none without ``[tls]``)."""
    if tls is None:
        return {}
    settings: dict[str, Any] = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}
    if tls.client_ca is not None:
        settings["ssl_ca_certs"] = str(tls.client_ca)
        if tls.require_client_cert:
            settings["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    return settings


class Gateway:
    def __init__(self, config: GatewayConfig, *, backend: Backend | None = None) -> None:
        self.config = config
        self.metrics = GatewayMetrics()
        # opened (its schema checked, the devices read) in start(), once the ports are held
        self.database = StateDatabase(config.state_url)
        self.registry = DeviceRegistry(self.database, load=False)
        self.metrics.state_queries.set_function(lambda: self.database.queries)
        self._registry_stop = threading.Event()
        self._registry_thread: threading.Thread | None = None
        backend = backend or EmbeddedBackend(config.runtime, config.precisions, config.formats)
        self.repository = ServingRepository(config.repository, backend)
        self.remotes = [RemoteBackend(settings) for settings in config.backends]
        self.access = Access(self.registry, config.rate_limit)
        self.plane = DataPlane(config, self.repository, self.metrics, remotes=self.remotes)
        self._watch_tasks: list[asyncio.Task[None]] = []
        rollouts = RolloutStore(self.database)
        self.ota: OtaService | None = None
        if config.ota_repository is not None:
            self.ota = OtaService(
                config.ota_repository, rollouts, heard=self.access.note_heard,
                on_refused=lambda reason: self.metrics.ota_reports_refused.labels(reason).inc(),
            )  # fmt: skip
        # the fleet's telemetry (over MQTT, or with the update checks) and the dashboard
        settings = config.dashboard
        self.fleet = FleetStore(self.database, history_s=settings.history_hours * 3600)
        self.telemetry = TelemetryIngest(self.registry, self.fleet, self.metrics)
        self.views = FleetViews(
            self.registry, self.fleet, rollouts, repository=self.repository,
            ota_repository=config.ota_repository,
        )  # fmt: skip
        self.sessions = Sessions(self.database, self.registry, settings)
        dashboard = None
        if settings.enabled:
            dashboard = DashboardContext(
                self.views,
                Operations(rollouts, self.fleet, self.views, announce=self._announce),
                self.sessions,
                self.registry,
                self.metrics,
                settings,
                secure=config.tls is not None,
            )
        self.app = create_app(
            self.plane, self.access, self.ota, telemetry=self.telemetry, dashboard=dashboard
        )
        self.http_port = config.http_port
        self.grpc_port = config.grpc_port
        self._http: uvicorn.Server | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._grpc: grpc.aio.Server | None = None
        self._poll_task: asyncio.Task[None] | None = None
        self.connections: ConnectionTracker | None = None
        self._undo: list[Callable[[], None]] = []  # what start() changed outside the gateway
        self.mqtt: MqttBridge | None = None
        if config.mqtt is not None:
            self.mqtt = MqttBridge(
                config.mqtt, self._mqtt_password(), self.plane, self.access, ota=self.ota,
                telemetry=self.telemetry,
            )  # fmt: skip

    def _announce(self, rollout: Rollout) -> None:
        """A rollout changed from the dashboard: tell the group's devices now."""
        if self.ota is not None:
            for listener in self.ota.listeners:
                listener(rollout)

    def _mqtt_password(self) -> str:
        path = self.config.mqtt_password_file
        try:
            password = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(
                f"the gateway's MQTT password: {exc.strerror} (`cloud-gateway mqtt acl` makes it)",
                path=path,
            ) from None
        if not password:
            raise ConfigError("the gateway's MQTT password file is empty", path=path)
        return password

    async def start(self) -> None:
        """Start serving, step by step: the ports first (a port in use is said at once,
        not after loading every model), then the state, the models, the front ends.

        Raises:
            ConfigError: a port is in use or may not be bound, or the state database
                cannot be used.
        """
        self._pin_front_ends()
        sock, grpc_server, cap = await self._hold_ports()
        self._watch_registry()
        await self._load_models()
        await grpc_server.start()
        await self._serve_http(sock, cap)
        config = self.config
        log.info(
            "listening on %s://%s:%d (REST) and %s:%d (gRPC%s)",
            "https" if config.tls else "http",
            config.host,
            self.http_port,
            config.host,
            self.grpc_port,
            ", TLS" if config.tls else "",
        )
        if self.mqtt is not None:
            await self.mqtt.start()
        loop = asyncio.get_running_loop()
        if config.poll_interval_s > 0:
            self._poll_task = loop.create_task(self._poll())
        self._watch_tasks.append(loop.create_task(self._heard_loop()))
        self._watch_tasks.append(loop.create_task(self._telemetry_loop()))
        self._watch_tasks.append(loop.create_task(self._trim_loop()))

    def _pin_front_ends(self) -> None:
        """With ``inference_cpus``: the loop's thread, and the gRPC and uvicorn threads it
        starts, stay off the inference cores."""
        inference = self.config.inference_cpus
        if inference is None:
            return
        front = cpus.others(inference)
        cpus.pin(front)
        log.info(
            "inference on cores %s, the front ends on %s",
            ",".join(map(str, inference)),
            ",".join(map(str, sorted(front))),
        )

    async def _hold_ports(self) -> tuple[Listener, grpc.aio.Server, int]:
        """Both ports bound and the state database opened; the REST socket, the gRPC
        server (not yet started) and the connections each front end takes (within the
        descriptors the process may open).

        Raises:
            ConfigError: a port is in use, or the state database cannot be used.
        """
        limits = self.config.connections
        limit = raise_descriptor_limit(3 * limits.max_connections + RESERVED_DESCRIPTORS)
        cap = connection_cap(limits.max_connections, limit)
        sock = self._listen_http()
        try:
            self._grpc = server = self._grpc_server(cap)
            await asyncio.get_running_loop().run_in_executor(None, self._open_state)
        except BaseException:
            sock.close()
            raise
        log.info(
            "at most %d connections on each front end (max_connections %d, descriptor limit %s); "
            "event loop %s",
            cap,
            limits.max_connections,
            limit or "none",
            loop_kind(asyncio.get_running_loop()),
        )
        return sock, server, cap

    def _watch_registry(self) -> None:
        """The devices are read again in a thread of their own when they change: a
        revocation anywhere reaches this replica within a second, no request waits."""
        self._registry_thread = threading.Thread(
            target=self.registry.watch, args=(self._registry_stop,), name="registry", daemon=True
        )
        self._registry_thread.start()

    async def _load_models(self) -> None:
        """The repository's models loaded, the remote engines checked and watched."""
        await self.plane.refresh()
        for remote in self.remotes:
            await self._check(remote)
            self._watch_tasks.append(asyncio.get_running_loop().create_task(self._watch(remote)))
        loaded = [f"{m.package.qualified_name} ({m.variant})" for m in self.repository.loaded()]
        log.info("models loaded: %s", ", ".join(loaded) or "none")

    async def _serve_http(self, sock: Listener, cap: int) -> None:
        """uvicorn serving the REST front end on ``sock``, once it has started.

        Raises:
            whatever stopped uvicorn while it started (a TLS file it cannot read).
        """
        limits = self.config.connections
        self.connections = ConnectionTracker(limits, cap, self.metrics)
        sock.on_exhausted = self.connections.exhausted
        self._undo.append(install_exhaustion_handler(asyncio.get_running_loop(), sock))
        thinning = ThrottleFilter(_CLIENT_CAUSED)
        uvicorn_log = logging.getLogger("uvicorn.error")
        uvicorn_log.addFilter(thinning)
        self._undo.append(lambda: uvicorn_log.removeFilter(thinning))
        self._http = uvicorn.Server(
            uvicorn.Config(
                # the inference route ahead of FastAPI
                InferFront(self.app, self.plane, self.access),
                # inference requests answered on the connection (cloud_gateway.rest.direct)
                http=direct_protocol_class(self.connections, self.plane, self.access),
                ws="none",
                timeout_keep_alive=math.ceil(limits.keep_alive_timeout_s),  # ours applies
                log_level="warning",
                access_log=False,
                # nothing here reads a client's address or scheme; uvicorn's default
                # rewrites both from X-Forwarded-* sent by any loopback peer (HAProxy on
                # the host passes the clients' own), and costs ~15 us a request
                proxy_headers=False,
                lifespan="off",
                timeout_graceful_shutdown=5,
                **_uvicorn_tls(self.config.tls),
            )
        )
        self._http_task = asyncio.get_running_loop().create_task(self._http.serve(sockets=[sock]))
        while not self._http.started:
            if self._http_task.done():
                await self._http_task  # raises the start-up error
                raise RuntimeError("the HTTP server stopped while starting")
            await asyncio.sleep(0.01)

    def _open_state(self) -> None:
        """The state database's schema brought up to date, the files of a gateway from
        before it imported, the devices read. Raises: ConfigError."""
        upgrade(self.database, legacy_dir=self.config.state_dir)
        self.registry.refresh(force=True)
        if not self.registry.loaded:
            raise ConfigError(
                f"the device registry could not be read from {self.registry.path}", field="state"
            )

    def _listen_http(self) -> Listener:
        """The REST front end's socket, bound and listening.

        Raises:
            ConfigError: the port is in use or may not be bound here.
        """
        config = self.config
        try:
            sock = _bind(config.host, config.http_port)
        except OSError as exc:
            raise _port_error("http_port", "REST", config.host, config.http_port, exc) from None
        self.http_port = sock.getsockname()[1]
        return sock

    def _grpc_server(self, cap: int) -> grpc.aio.Server:
        """The gRPC front end, its port bound (not yet started).

        Raises:
            ConfigError: the port is in use or may not be bound here.
        """
        config, limits = self.config, self.config.connections
        if config.grpc_port:  # a port in use, said by us (gRPC would first log its own error)
            try:
                _bind(config.host, config.grpc_port).close()
            except OSError as exc:
                raise _port_error("grpc_port", "gRPC", config.host, config.grpc_port, exc) from None
        options = [
            ("grpc.max_receive_message_length", config.max_body_bytes),
            ("grpc.max_send_message_length", config.max_body_bytes),
            ("grpc.so_reuseport", 0),
            # past the cap, gRPC closes a new connection as soon as it is accepted
            ("grpc.max_allowed_incoming_connections", cap),
            # a connection that sends nothing (no TLS hello, no HTTP/2 preface) is closed
            ("grpc.server_handshake_timeout_ms", _ms(limits.header_timeout_s)),
            ("grpc.max_connection_idle_ms", _ms(limits.grpc_idle_timeout_s)),
            ("grpc.max_connection_age_ms", _ms(limits.grpc_max_connection_age_s)),
            ("grpc.max_connection_age_grace_ms", _ms(limits.grpc_max_connection_age_grace_s)),
            # grpc counts a call against this until the gateway has released it, not
            # until its answer left (its HTTP/2 rapid-reset defence, kept on): a client
            # that keeps near this many calls open on one connection is refused some
            # (REFUSED_STREAM, which clients do not retry), hence a limit well above
            # the calls one client process keeps open
            ("grpc.max_concurrent_streams", limits.grpc_max_concurrent_streams),
            ("grpc.http.overload_protection", 1),
            # calls accepted and not yet taken by the gateway, above what one
            # connection can hold
            *_pending_call_limits(limits.grpc_max_concurrent_streams),
        ]
        server = grpc.aio.server(options=options)
        add_to_server(InferenceServicer(self.plane, self.access), server)
        address = f"{config.host}:{config.grpc_port}"
        credentials = None
        if config.tls is not None:
            tls = config.tls
            credentials = grpc.ssl_server_credentials(
                [(tls.key.read_bytes(), tls.cert.read_bytes())],
                root_certificates=tls.client_ca.read_bytes() if tls.client_ca else None,
                require_client_auth=tls.require_client_cert,
            )
        try:
            port: int = (
                server.add_secure_port(address, credentials)
                if credentials is not None
                else server.add_insecure_port(address)
            )
        except RuntimeError as exc:  # grpc's "Failed to bind to address"
            raise _port_error("grpc_port", "gRPC", config.host, config.grpc_port, exc) from None
        if port == 0:
            raise _port_error("grpc_port", "gRPC", config.host, config.grpc_port, None)
        self.grpc_port = port
        return server

    async def _check(self, remote: RemoteBackend) -> None:
        """One health check of an engine; its models join (or change) when it comes up."""
        before = list(remote.models)
        try:
            changed = await remote.check()
        except Exception:
            log.exception("checking engine %s failed", remote.name)
            return
        if changed:
            self.repository.set_remote(remote.name, remote.models)
            await self.plane.apply(remote.models, before)
        self.metrics.engine_up.labels(remote.name).set(1 if remote.up else 0)

    async def _watch(self, remote: RemoteBackend) -> None:
        while True:
            await asyncio.sleep(remote.settings.health_interval_s)
            await self._check(remote)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_interval_s)
            try:
                await self.plane.refresh()
            except Exception:
                log.exception("repository scan failed")

    async def _heard_loop(self) -> None:
        while True:
            await asyncio.sleep(HEARD_INTERVAL_S)
            await self._record_heard()

    async def _trim_loop(self) -> None:
        """Give back what large requests left free in the heap (:class:`HeapTrimmer`),
        off the event loop."""
        trimmer, loop = HeapTrimmer(), asyncio.get_running_loop()
        while True:
            await asyncio.sleep(TRIM_INTERVAL_S)
            await loop.run_in_executor(None, trimmer.check)

    async def _telemetry_loop(self) -> None:
        """Write the telemetry taken in the last second, in one batch off the event loop;
        once a minute, drop what is past the kept history, the expired sign-ins and the
        reports past each device's kept versions."""
        loop = asyncio.get_running_loop()
        last_prune = 0.0
        while True:
            await asyncio.sleep(TELEMETRY_INTERVAL_S)
            await self._flush_telemetry()
            if loop.time() - last_prune >= PRUNE_INTERVAL_S:
                last_prune = loop.time()
                try:
                    await loop.run_in_executor(None, self._prune)
                except Exception:
                    log.exception("pruning the fleet's history failed")

    def _prune(self) -> None:
        self.fleet.prune()
        self.sessions.prune()
        if self.ota is not None:
            self.ota.rollouts.prune_reports()

    async def _flush_telemetry(self) -> None:
        if not self.telemetry.pending:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.telemetry.flush)
        except Exception:
            log.exception("writing the devices' telemetry failed")

    async def _record_heard(self) -> None:
        """Write when devices were last heard from (``device list``), in a batch off the
        event loop: a request only notes it in memory."""
        heard = self.access.take_heard()
        if self.ota is None or not heard:
            return
        rollouts = self.ota.rollouts
        by_kind: dict[str, dict[str, float]] = {}
        for device, (at, what) in heard.items():
            by_kind.setdefault(what, {})[device] = at

        def write() -> None:
            for what, devices in by_kind.items():
                rollouts.seen_many(devices, what)  # one statement a kind

        try:
            await asyncio.get_running_loop().run_in_executor(None, write)
        except Exception:
            log.exception("recording the devices heard from failed")

    async def stop(self) -> None:
        for task in [self._poll_task, *self._watch_tasks]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._record_heard()
        if self.mqtt is not None:
            await self.mqtt.stop()
        await self._flush_telemetry()
        if self._http is not None and self._http_task is not None:
            self._http.should_exit = True
            await self._http_task
        if self._grpc is not None:
            await self._grpc.stop(grace=5)
        await self.plane.close()
        for remote in self.remotes:
            await remote.close()
        self._registry_stop.set()
        if self._registry_thread is not None:
            self._registry_thread.join(timeout=5)
        self.database.close()
        while self._undo:
            self._undo.pop()()

    async def serve_forever(self) -> None:
        """Serve until SIGINT or SIGTERM, then stop gracefully."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        # What start-up allocated (modules, models, sessions) lives as long as the
        # server: out of the collector's way, full collections stay short instead of
        # stalling every request in flight (the tail of the latency).
        gc.freeze()
        await stop.wait()
        log.info("stopping")
        await self.stop()


class GatewayThread:
    """A gateway on its own event loop (the one ``serve`` runs on, see
    :mod:`edge_core.loops`) in a background thread."""

    def __init__(
        self, config: GatewayConfig, *, backend: Backend | None = None, loop: str = "auto"
    ) -> None:
        self._loop = new_event_loop(loop)
        self._thread = threading.Thread(target=self._loop.run_forever, name="gateway", daemon=True)
        self._thread.start()
        self.gateway: Gateway = self.call(self._build(config, backend))

    async def _build(self, config: GatewayConfig, backend: Backend | None) -> Gateway:
        gateway = Gateway(config, backend=backend)
        await gateway.start()
        return gateway

    def call(self, coroutine: Any) -> Any:
        """Run a coroutine on the gateway's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.gateway.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.gateway.grpc_port}"

    def stop(self) -> None:
        """Stop the gateway and its loop; stopping a stopped one does nothing."""
        if self._loop.is_closed():
            return
        try:
            self.call(self.gateway.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
