"""``python -m benchmarks service``: what ``edge-agent run`` costs, run as systemd runs it.

One run. The daemon is a child process told to notify a socket of ours
(``NOTIFY_SOCKET``, so ``READY=1`` arrives as it would at systemd), on a fake
device root (its power mode goes there, not to this machine's governors, and
no real load average sways the policy), with profile ``raspberry-pi-5``:

1. overhead: the same one-row ``digits-light`` request through ``Agent.infer``
   in this process, over HTTP (keep-alive ``http.client``, binary tensor body)
   and over gRPC (a bare stub fed by ``request_to_proto``) to the daemon,
   interleaved call by call; p50/p99 and what the local API adds;
2. startup and idle memory with one INT8 TFLite model: HTTP only, HTTP +
   gRPC, and everything on (gRPC, HTTP offload to a gateway in a child
   process, MQTT to a Mosquitto on loopback, telemetry): ``VmRSS`` after a
   few idle seconds, and ``Popen`` to ``READY=1`` over several starts. The
   daemon cannot say what its memory goes to, so a probe starts each
   configuration in a fresh interpreter under ``-X importtime`` and lists
   ``sys.modules``; another fresh interpreter imports those modules again,
   package by package with dependencies first, reading its RSS after each;
3. a bounded soak of the everything-on daemon: client threads (half HTTP,
   half gRPC) mixing local, escalated and cloud-only requests with and
   without privacy labels, RSS sampled as it runs, telemetry counted at the
   broker.

The targets (idle RSS <= 80 MB, READY within 1.5 s) are reported met or not.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.agent.hybrid import gateway_process
from benchmarks.agent.mosquitto import Mosquitto
from benchmarks.agent.service_daemon import (
    DEVICE,
    HEAVY,
    MIX,
    PROFILE,
    READY_TARGET_S,
    REFUSED,
    RSS_TARGET_MB,
    Array,
    BenchConfig,
    GrpcClient,
    HttpClient,
    RunningDaemon,
    ServiceSettings,
    fake_root,
    light_request,
    metric_sum,
    running,
    write_config,
)
from benchmarks.agent.service_imports import (
    measure_imports,
)
from edge_agent.assemble import create_agent
from edge_agent.config import AgentConfig, PrivacySettings
from edge_core.errors import EdgeError
from edge_core.protocol.types import InferResponse
from edge_core.report import machine_info, percentiles_ms
from edge_core.repository import ModelRepository

__all__ = ["ServiceSettings", "format_service", "run_service"]

from benchmarks.agent.service_report import format_service

# -- 1. overhead --------------------------------------------------------------------------


def _overhead(
    daemon: RunningDaemon, root: Path, models: Path, x: Array, settings: ServiceSettings
) -> dict[str, Any]:
    agent = create_agent(
        AgentConfig(
            profile=PROFILE,
            root=root,
            model_dir=models,
            privacy=PrivacySettings(face_detector=False),
        )
    )
    request = light_request(x)
    clients: list[HttpClient | GrpcClient] = [
        HttpClient(daemon.config.http_port),
        GrpcClient(daemon.config.grpc_port),
    ]

    def local() -> Array:
        return agent.infer("digits-light", {"pixels": request.inputs["pixels"]}).outputs[
            "probabilities"
        ]

    def over(client: HttpClient | GrpcClient) -> Callable[[], Array]:
        def call() -> Array:
            status, response = client.infer(request)
            if status not in ("200", "OK"):
                raise EdgeError(f"the daemon answered {status}: {response}")
            outputs: Array = response.outputs["probabilities"]
            return outputs

        return call

    paths = {"in-process": local, "http": over(clients[0]), "grpc": over(clients[1])}
    try:
        outputs = {name: call() for name, call in paths.items()}
        for _ in range(settings.warmup):
            for call in paths.values():
                call()
        samples: dict[str, list[int]] = {name: [] for name in paths}
        order = list(paths)
        for index in range(settings.requests):
            shift = index % len(order)  # rotated: no path always runs right after another
            for name in order[shift:] + order[:shift]:
                started = time.perf_counter_ns()
                paths[name]()
                samples[name].append(time.perf_counter_ns() - started)
        variant = agent.loaded()["digits-light"]["variant"]
    finally:
        for client in clients:
            client.close()
        agent.close()
    stats = {name: percentiles_ms(values) for name, values in samples.items()}
    base = stats["in-process"]
    return {
        "requests": settings.requests,
        "warmup": settings.warmup,
        "http": "http.client, one keep-alive connection, binary tensor body",
        "grpc": "bare grpc stub (request_to_proto), one channel",
        "variant": {"in-process": variant, "daemon": daemon.loaded_variants().get("digits-light")},
        "same_outputs": all(np.array_equal(outputs["in-process"], v) for v in outputs.values()),
        "paths": stats,
        "overhead_p50_ms": {
            n: round(stats[n]["p50_ms"] - base["p50_ms"], 4) for n in ("http", "grpc")
        },
        "overhead_p99_ms": {
            n: round(stats[n]["p99_ms"] - base["p99_ms"], 4) for n in ("http", "grpc")
        },
    }


# -- 2. startup and idle memory -----------------------------------------------------------


def _starts(config: BenchConfig, tmp: Path, settings: ServiceSettings) -> dict[str, Any]:
    ready, own, rss = [], [], []
    variants: dict[str, str] = {}
    for _ in range(settings.starts):
        daemon = RunningDaemon(config, tmp)
        try:
            ready.append(daemon.wait_ready())
            time.sleep(settings.idle_s)
            rss.append(daemon.rss())  # before /metrics: nothing but idling so far
            variants = daemon.loaded_variants()
            own.append(daemon.own_start_s() or 0.0)
        finally:
            daemon.stop()
    vm = [r["VmRSS"] for r in rss]
    return {
        "starts": settings.starts,
        "ready_s": [round(v, 3) for v in ready],
        "ready_median_s": round(statistics.median(ready), 3),
        "ready_max_s": round(max(ready), 3),
        "own_start_median_s": round(statistics.median(own), 3),
        "rss_mb": vm,
        "rss_median_mb": round(statistics.median(vm), 1),
        "rss_max_mb": max(vm),
        "rss_anon_median_mb": round(statistics.median(r["RssAnon"] for r in rss), 1),
        "rss_file_median_mb": round(statistics.median(r["RssFile"] for r in rss), 1),
        "variants": variants,
        "ready_target_met": max(ready) <= READY_TARGET_S,
        "rss_target_met": max(vm) <= RSS_TARGET_MB,
    }


# -- 3. soak ------------------------------------------------------------------------------


@dataclass
class _Tally:
    """One client thread's counts, merged at the end (no lock on the hot path)."""

    by_status: Counter[str] = field(default_factory=Counter)
    by_decision: Counter[str] = field(default_factory=Counter)
    by_kind: dict[str, Counter[str]] = field(default_factory=dict)
    latency_ns: dict[str, list[int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def merge(self, other: _Tally) -> None:
        self.by_status.update(other.by_status)
        self.by_decision.update(other.by_decision)
        for kind, counts in other.by_kind.items():
            self.by_kind.setdefault(kind, Counter()).update(counts)
        for kind, values in other.latency_ns.items():
            self.latency_ns.setdefault(kind, []).extend(values)
        self.errors.extend(other.errors)


def _client_loop(
    protocol: str, port: int, rows: Array, offset: int, stop: threading.Event, tally: _Tally
) -> None:
    client = HttpClient(port) if protocol == "http" else GrpcClient(port)
    schedule = [(model, label) for model, label, weight in MIX for _ in range(weight)]
    index = offset
    try:
        while not stop.is_set():
            model, label = schedule[index % len(schedule)]
            row = index % len(rows)
            kind = f"{model} {label or 'public'}"
            counts = tally.by_kind.setdefault(kind, Counter())
            index += 1
            started = time.perf_counter_ns()
            try:
                status, body = client.infer(light_request(rows[row : row + 1], model), label)
            except Exception as exc:  # counted: the target is none
                status, body = type(exc).__name__, {"error": str(exc)}
            tally.latency_ns.setdefault(kind, []).append(time.perf_counter_ns() - started)
            tally.by_status[f"{protocol} {status}"] += 1
            counts["sent"] += 1
            if isinstance(body, InferResponse):
                params = body.parameters
                counts[str(params.get("edge_where"))] += 1
                counts["degraded"] += bool(params.get("edge_degraded"))
                tally.by_decision[f"{params.get('edge_action')}/{params.get('edge_reason')}"] += 1
            elif status in REFUSED:
                counts["refused"] += 1
                decision = body.get("decision")  # HTTP says why; a gRPC status cannot
                tally.by_decision[
                    f"{decision['decision']}/{decision['reason']}" if decision else status
                ] += 1
            else:
                counts["error"] += 1
                if len(tally.errors) < 10:
                    tally.errors.append(f"{kind} over {protocol}: {status} {body}")
    finally:
        client.close()


class _BrokerTap:
    """Counts what the device publishes to the broker (its telemetry, its status)."""

    def __init__(self, port: int) -> None:
        from edge_core.mqtt import new_client

        self.counts: Counter[str] = Counter()
        self._client = new_client("bench-tap", None, None, None)
        self._client.on_connect = lambda client, *args: client.subscribe(f"devices/{DEVICE}/#")
        self._client.on_message = self._on_message
        self._client.connect("127.0.0.1", port)
        self._client.loop_start()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        self.counts[message.topic.removeprefix(f"devices/{DEVICE}/")] += 1

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def _soak(
    daemon: RunningDaemon, rows: Array, settings: ServiceSettings, broker: int | None
) -> dict[str, Any]:
    config = daemon.config
    tallies = [_Tally() for _ in range(settings.soak_threads)]
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=_client_loop,
            args=("http", config.http_port) if index % 2 == 0 else ("grpc", config.grpc_port),
            kwargs={"rows": rows, "offset": index * 7, "stop": stop, "tally": tallies[index]},
            daemon=True,
        )
        for index in range(settings.soak_threads)
    ]
    tap = _BrokerTap(broker) if broker is not None else None
    counted = metric_sum(daemon.metrics(), "edge_agent_requests_total") or 0.0
    samples = [(0.0, daemon.rss()["VmRSS"])]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    end = started + settings.soak_s
    every = min(settings.sample_every_s, settings.soak_s / 4)  # a short soak: four samples
    while (left := end - time.perf_counter()) > 0:
        time.sleep(min(every, left))
        if time.perf_counter() < end - 0.5:
            samples.append((round(time.perf_counter() - started, 1), daemon.rss()["VmRSS"]))
    stop.set()
    for thread in threads:
        thread.join(60)
    elapsed = time.perf_counter() - started
    samples.append((round(elapsed, 1), daemon.rss()["VmRSS"]))
    if tap is not None:
        tap.close()
    metrics = daemon.metrics()
    total = _Tally()
    for tally in tallies:
        total.merge(tally)
    sent = sum(total.by_status.values())
    rss = [value for _, value in samples]
    return {
        "seconds": round(elapsed, 1),
        "threads": {"http": (settings.soak_threads + 1) // 2, "grpc": settings.soak_threads // 2},
        "requests": sent,
        "requests_per_s": round(sent / elapsed, 1),
        "errors": sum(counts["error"] for counts in total.by_kind.values()),
        "error_samples": total.errors[:10],
        "daemon_counted": round((metric_sum(metrics, "edge_agent_requests_total") or 0) - counted),
        "by_status": dict(sorted(total.by_status.items())),
        "by_decision": dict(total.by_decision.most_common()),
        "by_kind": {
            kind: {**counts, **percentiles_ms(total.latency_ns[kind])}
            for kind, counts in sorted(total.by_kind.items())
        },
        "published": dict(tap.counts) if tap is not None else None,
        "telemetry_queue_waiting": metric_sum(metrics, "edge_agent_telemetry_queue_messages"),
        "rss_samples": samples,
        "rss_start_mb": rss[0],
        "rss_end_mb": rss[-1],
        "rss_max_mb": max(rss),
        "rss_growth_mb": round(rss[-1] - rss[0], 1),
        # from the first sample under load: connections, pools and caches are filled by then
        "rss_growth_under_load_mb": round(rss[-1] - rss[1], 1) if len(rss) > 2 else None,
    }


# -- the run ------------------------------------------------------------------------------


def run_service(model_dir: Path, settings: ServiceSettings | None = None) -> dict[str, Any]:
    """The three parts, in one run: the report (JSON-serialisable).

    Raises:
        EdgeError: a daemon or the import probe failed, or the models are not there.
    """
    settings = settings or ServiceSettings()
    model_dir = Path(model_dir).resolve()
    report: dict[str, Any] = {
        "benchmark": "service",
        "machine": machine_info(),
        "profile": PROFILE,
        "settings": asdict(settings),
        "targets": {"idle_rss_mb": RSS_TARGET_MB, "ready_s": READY_TARGET_S},
    }
    rows = ModelRepository(model_dir).get("digits-light").evaluation()[0].astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="bench-service-") as name:
        tmp = Path(name)
        root = fake_root(tmp / "root")
        light = tmp / "light"  # the daemon's models: one, whose INT8 TFLite variant loads
        served = tmp / "served"  # the gateway's: the cloud-only model, and the light one
        for directory, models in ((light, ["digits-light"]), (served, ["digits-light", *HEAVY])):
            directory.mkdir()
            for model in models:
                (directory / model).symlink_to(model_dir / model)

        api = write_config(tmp, "http + grpc", root=root, models=light, grpc=True)
        with running(api, tmp) as daemon:
            report["overhead"] = _overhead(daemon, root, light, rows[:1], settings)

        with contextlib.ExitStack() as stack:
            gateway = stack.enter_context(gateway_process(served, tmp / "gateway"))
            token = tmp / "device.token"
            token.write_text(gateway["token"] + "\n")
            token.chmod(0o600)
            extra = (
                f'[gateway]\nprotocol = "http"\naddress = "{gateway["http"]}"\n'
                f'token_file = "{token}"\n'
            )
            broker: int | None = None
            try:
                mosquitto = Mosquitto(tmp / "broker")
                mosquitto.start()
                stack.callback(mosquitto.stop)
                broker = mosquitto.port
                extra += (
                    f'[mqtt]\nhost = "127.0.0.1"\nport = {broker}\n'
                    f"[telemetry]\ninterval_s = {settings.telemetry_interval_s}\n"
                )
                report["mqtt"] = "Mosquitto on loopback (anonymous), telemetry on"
            except EdgeError as exc:
                report["mqtt"] = f"skipped: {exc}"
            configs = [
                write_config(tmp, "http only", root=root, models=light, grpc=False),
                api,
                write_config(tmp, "everything on", root=root, models=light, grpc=True, extra=extra),
            ]
            report["startup"] = {c.name: _starts(c, tmp, settings) for c in configs}
            if settings.imports:
                report["imports"] = measure_imports(configs, tmp)
            with running(configs[-1], tmp) as daemon:
                report["soak"] = _soak(daemon, rows, settings, broker)
    return report


# -- the tables ---------------------------------------------------------------------------
