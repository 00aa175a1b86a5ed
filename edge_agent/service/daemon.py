"""``edge-agent run``: the agent as a long-running service.

Start: load the configuration (or the embedded defaults), the profile
(detected or named), apply its power mode, build the agent, load and warm its
models, start the updater, the fleet link (telemetry and announcements over
MQTT), the thermal loop and the local API, then tell systemd ``READY=1`` and
keep its watchdog fed while the main loop is alive.

Signals, handled on the main thread:

- SIGTERM (and SIGINT): ``STOPPING=1``; stop accepting (new requests get 503 /
  UNAVAILABLE), let requests in flight finish within ``[api] drain_s``, send
  what telemetry the broker takes in two seconds (the rest stays queued on
  disk), stop the loops, exit 0.
- SIGHUP: ``RELOADING=1``; read the configuration and policy again and build a
  new agent beside the running one; if anything is wrong the new one is
  refused, the running one kept, and the log says why. Requests never wait
  for a reload: they go to whichever agent is current when they arrive.
  ``[api]``, ``[mqtt]``, ``[ota]``, ``[logging]``, ``[telemetry]``,
  ``[thermal]``, ``device_id``, ``profile``, ``root`` and ``state_dir`` take a
  restart (a reload that changes them keeps the running values and says so).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from edge_agent.agent import Agent
from edge_agent.assemble import (
    bundled_version,
    create_agent,
    create_connection,
    create_fleet_link,
    create_updater,
    resolve_profile,
)
from edge_agent.config import AgentConfig, load_agent_config
from edge_agent.service.frontend import LocalService
from edge_agent.service.metrics import ServiceMetrics
from edge_agent.service.notify import Notifier
from edge_agent.service.thermal import ThermalController
from edge_agent.streams import Streams
from edge_core.errors import ConfigError, EdgeError
from edge_core.memory import HeapTrimmer
from edge_core.repository import ModelRepository

__all__ = ["Daemon"]

log = logging.getLogger(__name__)

# what a reload keeps from the running configuration (a change is logged): the
# listeners, connections, loops and files opened at start, and who the device is
RESTART_SECTIONS = ("api", "mqtt", "ota", "logging", "telemetry", "thermal")
RESTART_KEYS = ("device_id", "profile", "root", "state_dir")


STORE_WATCH_S = 1.0  # how often the OTA store's active versions are compared with the served


def without_httpx_command_line() -> None:
    """Keep httpx from importing its command line's libraries.

    ``import httpx`` imports ``httpx._main`` when it can, and with it click, rich and
    pygments (~6 MB of the daemon's memory) wherever they happen to be installed (a
    development environment, a device image with other tools); the daemon, which
    offloads and updates over httpx, never runs that command line. httpx treats a
    ``_main`` that cannot be imported as its own install without the ``cli`` extra,
    its supported configuration (tests/agent/test_daemon.py checks that it still does).
    Called once, when the daemon is made, before anything imports httpx.
    """
    if "httpx" not in sys.modules:
        sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]


class Daemon:
    def __init__(
        self,
        config_path: Path | None = None,
        *,
        http_port: int | None = None,
        grpc_port: int | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        without_httpx_command_line()
        self.config_path = config_path
        self._http_port, self._grpc_port = http_port, grpc_port
        self.notifier = notifier or Notifier()
        self.metrics = ServiceMetrics(self.snapshot)
        self.service = LocalService(lambda: self.agent, self.metrics)
        self.ota_outcomes: Counter[str] = Counter()
        self.agent: Agent
        self.config: AgentConfig
        self.thermal: ThermalController | None = None
        self.streams: Streams | None = None
        self.power_mode: str | None = None  # the mode in force (None: none applied)
        self.updater: Any = None
        self.link: Any = None
        self.connection: Any = None
        self.apis: list[Any] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._swapping = threading.Lock()  # one model swap at a time
        self._heartbeat = time.monotonic()
        self.started_s = 0.0  # from the start of start() to READY=1

    # -- configuration ------------------------------------------------------------------------

    def load_config(self) -> AgentConfig:
        config = load_agent_config(self.config_path)
        api = config.api
        if self._http_port is not None:
            api = replace(api, http_port=self._http_port)
        if self._grpc_port is not None:
            api = replace(api, grpc_port=self._grpc_port)
        return replace(config, api=api)

    def _build_agent(self, config: AgentConfig) -> Agent:
        agent = create_agent(
            config,
            profile=self.profile,
            connection=self.connection,
            device_state=self.thermal.state if self.thermal is not None else None,
        )
        agent.power_mode = self.power_mode
        if self.thermal is not None and self.thermal.precision is not None:
            agent.prefer_precision(self.thermal.precision)
        self._warm(agent, config)
        if agent.offload is not None:  # what the cloud serves, listed before any request
            agent.offload.catalog.refresh_in_background()
        return agent

    def _warm(self, agent: Agent, config: AgentConfig) -> None:
        """Load (and warm up) every model that may run here, so no request pays for it;
        the face detectors are the privacy checks' (loaded by them), unless asked for."""
        from edge_agent.privacy.faces import DETECTOR_MODELS

        for name in ModelRepository(config.model_dir).names():
            if name not in DETECTOR_MODELS:
                agent.warm(name)

    # -- start and stop -----------------------------------------------------------------------

    def start(self) -> None:
        started = time.monotonic()
        config = self.config = self.load_config()
        self.profile = resolve_profile(config)
        if config.thermal.enabled:
            self.thermal = ThermalController(
                self.profile,
                config.root,
                set_precision=lambda precision: self.agent.prefer_precision(precision),
                interval_s=config.thermal.interval_s,
                hysteresis_c=config.thermal.hysteresis_c,
            )
            self.thermal.on_change(self._thermal_changed)
        self._apply_power_mode(config)
        self.connection = create_connection(config)
        self.agent = self._build_agent(config)
        if config.ota is not None:
            self.updater = create_updater(config, self.profile)
            self.updater.on_installed = self._swap_in
            self.updater.listeners.append(
                lambda outcome: self.ota_outcomes.update([outcome.status])
            )
            if self.connection is None or config.telemetry is None:
                # no broker to carry telemetry: it goes with every update check instead
                self.updater.telemetry = self._http_telemetry
            self._thread(self.updater.run, "updater")
            self._thread(self._follow_store, "ota-store")
        if self.connection is not None:
            self.link = create_fleet_link(
                config,
                self.connection,
                agent=lambda: self.agent,
                updater=self.updater,
                streams=lambda: self.streams.snapshot() if self.streams is not None else {},
            )
            self.link.start()
        if self.thermal is not None:
            self.thermal.start()
        self.streams = self._build_streams(config)
        self.service.streams = self.streams
        self._start_apis(config)
        if self.streams is not None:
            self.streams.start()
        self.started_s = time.monotonic() - started
        models = ", ".join(self.agent.loaded()) or "no models"
        where = ", ".join(api.address for api in self.apis) or "no local API"
        self.notifier.ready(f"serving {models} on {where}")
        self.notifier.start_watchdog(self._healthy)
        log.info(
            "ready in %.2f s: profile %s, %s, on %s", self.started_s, self.profile.id, models, where
        )

    def _http_telemetry(self) -> dict[str, dict[str, Any]]:
        """The periodic telemetry, sent with the update checks (no broker): its status says
        how often those come, for the gateway's offline rule."""
        from edge_agent.reports import agent_reports

        reports = agent_reports(self.agent)
        ota = self.config.ota
        if ota is not None:
            reports["status"]["interval_s"] = ota.interval_s + ota.jitter_s
        return reports

    def _swap_in(self, name: str, package: Any = None) -> None:
        """Serve ``package`` (or the store's active version) of ``name``; one swap at a
        time, whoever asks (the updater, or what follows the store)."""
        with self._swapping:
            self.agent.reload(name, package)

    def _follow_store(self) -> None:
        """Swap in what another process activated in the OTA store: `edge-agent models
        rollback NAME` or `edge-agent update` run beside the daemon."""
        store = self.updater.store
        bundled = bundled_version(self.config)
        failed: set[tuple[str, int]] = set()  # tried once; a new activation tries again
        while not self._stop.wait(STORE_WATCH_S):
            for name in self.agent.loaded():
                wanted = None
                try:
                    with self._swapping:  # what is served, and what should be, then
                        serving = self.agent.loaded().get(name, {}).get("version")
                        active = store.active(name)
                        # none active (a rollback to the bundled model): the bundled one
                        wanted = active.version if active is not None else bundled(name)
                        if wanted is None or wanted == serving or (name, wanted) in failed:
                            continue
                        self.agent.reload(name)
                    log.info("%s: the store now serves version %d", name, wanted)
                except Exception as exc:  # the old version keeps serving
                    failed.add((name, wanted if wanted is not None else -1))
                    log.error("%s: cannot swap in the store's version: %s", name, exc)

    def _thread(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _apply_power_mode(self, config: AgentConfig) -> None:
        """Put the device in its power mode; ``power_mode`` says the one in force (``None``:
        none was applied, and telemetry and /metrics say so rather than the profile's)."""
        from edge_agent.profiles.power import apply_plan, plan_power_mode

        mode = self.thermal.power_mode if self.thermal else self.profile.default_power_mode
        try:
            apply_plan(plan_power_mode(self.profile, mode, config.root))
            log.info("power mode %s applied", mode)
            self.power_mode = mode
        except EdgeError as exc:  # not root, or a board without cpufreq: serve anyway
            log.warning("power mode %s not applied: %s", mode, exc)
            self.power_mode = None

    def _start_apis(self, config: AgentConfig) -> None:
        try:
            self._open_apis(config)
        except (OSError, RuntimeError) as exc:  # a port in use, an address not on this host
            raise ConfigError(f"[api]: cannot listen: {exc}", path=config.source) from exc

    def _open_apis(self, config: AgentConfig) -> None:
        api = config.api
        if api.socket is not None or api.http_port:
            from edge_agent.service.http_api import HttpApi

            http = HttpApi(self.service, api)
            http.start()
            self.apis.append(http)
        if api.grpc_port:
            try:
                from edge_agent.service.grpc_api import GrpcApi
            except ImportError as exc:
                raise ConfigError(
                    f"the local gRPC API needs grpcio and tritonclient ({exc}): install the "
                    "`service` extra, or set [api] grpc_port = 0 to serve HTTP only",
                    path=config.source,
                ) from None

            grpc = GrpcApi(self.service, api)
            grpc.start()
            self.apis.append(grpc)

    def stop(self) -> bool:
        """Stop gracefully; whether every request in flight finished in time."""
        drain_s = self.config.api.drain_s
        self.notifier.stopping()
        log.info("stopping: %d requests in flight", self.service.inflight)
        # new requests are answered 503 (connections waiting to be accepted too, rather
        # than reset), those in flight finish; then the listeners close
        self.service.stop_accepting()
        if self.streams is not None and not self.streams.stop(drain_s):
            log.warning("a stream's frames were still running after %.1f s", drain_s)
        drained = self.service.drain(drain_s)
        if not drained:
            log.warning("%d requests still running after %.1f s", self.service.inflight, drain_s)
        steps: list[Any] = [*(lambda api=api: api.stop(grace=0.5) for api in self.apis)]
        if self.thermal is not None:
            steps.append(self.thermal.stop)
        if self.updater is not None:
            steps.append(self.updater.stop)
        if self.link is not None:
            steps.append(lambda: self.link.stop(drain_s=2.0))
        steps += [self.agent.close, self.notifier.stop]
        for step in steps:  # each on its own: one failing must not keep the rest from running
            try:
                step()
            except Exception:
                log.exception("while stopping")
        log.info("stopped")
        return drained

    # -- reload ---------------------------------------------------------------------------------

    def reload(self) -> bool:
        """Apply the configuration and policy on disk; keep the running ones if they are bad."""
        self.notifier.reloading()
        kept = (*RESTART_SECTIONS, *RESTART_KEYS)
        try:
            loaded = self.load_config()
            # the new agent is built for the running device (its profile, root and id)
            config = replace(loaded, **{name: getattr(self.config, name) for name in kept})
            agent = self._build_agent(config)
            restart = config.streams != self.config.streams  # else the running ones go on
            streams = None
            if restart:
                try:  # built (checked, their sinks opened) before anything is swapped
                    streams = self._build_streams(config, check=agent)
                except BaseException:
                    agent.close()
                    raise
        except Exception as exc:  # whatever went wrong, the running agent stays
            message = str(exc) if isinstance(exc, EdgeError) else f"{type(exc).__name__}: {exc}"
            log.error("reload refused, the running configuration stays: %s", message)
            self.notifier.reloaded(f"reload refused: {message}")
            return False
        old, self.agent = self.agent, agent
        for name in kept:
            if getattr(loaded, name) != getattr(self.config, name):
                where = f"[{name}]" if name in RESTART_SECTIONS else name
                log.warning("%s changed: it takes effect at the next restart", where)
        self.config = config
        # requests already on the old agent finish there; it is closed when none is left
        self.service.retire(old)
        if restart:
            self._restart_streams(config, streams)
        log.info("reloaded %s", self.config_path or "the embedded defaults")
        self.notifier.reloaded()
        return True

    def _build_streams(self, config: AgentConfig, check: Agent | None = None) -> Streams | None:
        """The configuration's streams, on the agent of the moment (``check``: the agent
        their models are looked up on now).

        Raises:
            ConfigError: a stream cannot run here (its model, its sink).
        """
        if not config.streams:
            return None
        return Streams(
            config.streams,
            agent=lambda: self.agent,
            device_id=config.device_id,
            connection=self.connection,
            check=check,
        )

    def _restart_streams(self, config: AgentConfig, streams: Streams | None) -> None:
        """The streams of a reloaded configuration: the old ones drain (their event
        listeners end), the new ones start."""
        if self.streams is not None:
            self.streams.stop(config.api.drain_s)
        self.streams = streams
        self.service.streams = self.streams
        if self.streams is not None:
            self.streams.start()
        log.info("streams: %s", ", ".join(s.name for s in config.streams) or "none")

    # -- the main thread ------------------------------------------------------------------------

    def run(self) -> int:
        """Start, serve until SIGTERM or SIGINT (reloading on SIGHUP), stop; the exit code.

        The main loop wakes every second: it beats for the watchdog and gives back what
        large requests left free in the heap (:class:`~edge_core.memory.HeapTrimmer`)."""
        signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop.set())
        signal.signal(signal.SIGHUP, lambda *_: self._reload.set())
        self.start()
        reloading: threading.Thread | None = None
        trimmer = HeapTrimmer()
        while not self._stop.wait(1.0):
            self._heartbeat = time.monotonic()
            trimmer.check()
            if self._reload.is_set() and (reloading is None or not reloading.is_alive()):
                # on a thread: building a new agent may take long (engines, warm-up), and
                # the watchdog must go on hearing from the main loop meanwhile
                self._reload.clear()
                reloading = threading.Thread(target=self.reload, name="reload", daemon=True)
                reloading.start()
        if reloading is not None:
            reloading.join()
        self.stop()
        return 0

    def request_stop(self) -> None:
        self._stop.set()

    def _healthy(self) -> bool:
        """For the watchdog: the main loop goes round (it wakes every second)."""
        return time.monotonic() - self._heartbeat < 10.0 or self._stop.is_set()

    # -- observability --------------------------------------------------------------------------

    def _thermal_changed(self, change: dict[str, Any]) -> None:
        if change["power_mode"] != change["previous_power_mode"]:  # it applied this one
            self.power_mode = self.agent.power_mode = change["power_mode"]
        log.warning(
            "thermal level %s (%s): power mode %s, precision %s",
            change["level"],
            change.get("zone"),
            change["power_mode"],
            change["precision"] or "as the profile says",
        )
        telemetry = getattr(self.link, "telemetry", None)
        if telemetry is not None:
            telemetry.emit("thermal", change)

    def snapshot(self) -> dict[str, Any]:
        """The state /metrics shows."""
        if not hasattr(self, "agent"):
            return {}
        thermal = self.thermal
        state: dict[str, Any] = {
            "models": self.agent.loaded(),
            "inflight": self.service.inflight,
            "ota": dict(self.ota_outcomes),
            "power_mode": self.power_mode or "none",
            "thermal_level": thermal.level if thermal else "normal",
            "temperatures": dict(self.agent.device_state().temperatures),
        }
        telemetry = getattr(self.link, "telemetry", None)
        if telemetry is not None:
            state["queue"] = {"waiting": telemetry.queue.size, "dropped": telemetry.queue.dropped}
        if self.connection is not None:
            state["mqtt_dropped"] = self.connection.dropped_counts()
        if self.agent.offload is not None:
            from edge_agent.reports import offload_report

            state["offload"] = offload_report(self.agent)
        if self.streams is not None:
            state["streams"] = self.streams.snapshot()
        return state
