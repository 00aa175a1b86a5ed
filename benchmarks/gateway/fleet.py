"""``python -m benchmarks fleet``: N simulated devices against one or two replicas (P11).

The devices are light: no model, no runtime, no agent; each is a token and a
place in a connection pool, and speaks the real protocol: the update check
(``GET /v2/ota/plan``), the report (``POST /v2/ota/report``) and, when a broker
is at hand, telemetry (one QoS 1 status message each on
``devices/<id>/telemetry/status``, through a few shared MQTT connections). The
replicas are real ``cloud-gateway serve`` processes on one state database
(``--state``, SQLite by default, or a PostgreSQL URL), as in production. In one run:

1. *steady state*: every device checks once, spread over ``--interval`` seconds
   (the fleet's check rate, N / interval): requests/s, p50 and p99;
2. *rollout to 10%*: a rollout starts (as ``rollout start`` does, in the shared
   database) and is announced: every device checks within ``--jitter`` seconds
   (as agents do when they hear the broker's announcement), the ones in the
   slice report ``installed``; timed until the rollout's own counts
   (``rollout status``) say the whole slice installed it;
3. *rollout to 100%*: the same, for the rest of the group.

Database statements per update check are read from the replicas' own
``gateway_state_queries`` metric. Everything shares this machine's cores: the
simulator, the replicas, the database, the broker.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from cloud_gateway.ota.rollouts import RolloutStore, in_slice
from cloud_gateway.state import StateDatabase, describe, open_state, schema
from edge_core.processes import free_port, stop_process
from edge_core.report import machine_info, publish, render_table

__all__ = ["format_fleet", "register", "run_fleet"]

GROUP = "fleet"
MODEL = "digits-light"


def register(commands: Any) -> None:
    fleet = commands.add_parser("fleet", help="N simulated devices against one or two replicas")
    fleet.add_argument("--devices", type=int, default=1000)
    fleet.add_argument("--replicas", type=int, choices=[1, 2], default=1)
    fleet.add_argument("--state", dest="fleet_state", help="state URL (default: SQLite)")
    fleet.add_argument(
        "--interval", type=float, default=0.0, help="seconds over which every device checks "
        "once in the steady state (default: devices / 200)",
    )  # fmt: skip
    fleet.add_argument("--jitter", type=float, default=5.0, help="announcement to check, at most")
    fleet.add_argument("--connections", type=int, default=64, help="HTTP connections per replica")
    fleet.add_argument("--no-telemetry", action="store_true", help="no broker, no telemetry")
    fleet.add_argument("--json", type=Path, help="write the results here")
    fleet.set_defaults(run=run_fleet)


# -- the fleet's devices, in the state database -------------------------------------------


def enroll(database: StateDatabase, count: int) -> list[tuple[str, str]]:
    """``count`` devices in one transaction (no MQTT password: the simulator's broker is
    anonymous); their ids and tokens."""
    devices = [(f"sim-{i:06d}", "") for i in range(count)]
    devices = [(d, f"{d}.{secrets.token_urlsafe(32)}") for d, _ in devices]
    rows = [
        {"id": d, "grp": GROUP, "role": "device", "revoked": False, "created": "",
         "token_sha256": hashlib.sha256(t.encode()).hexdigest(), "mqtt_password": None}
        for d, t in devices
    ]  # fmt: skip
    with database.begin() as connection:
        connection.execute(schema.devices.insert(), rows)
        connection.execute(schema.serial.update().values(value=schema.serial.c.value + 1))
    return devices


# -- the replicas ---------------------------------------------------------------------------


def start_replicas(root: Path, url: str, count: int) -> list[tuple[subprocess.Popen[bytes], int]]:
    (root / "models").mkdir()
    (root / "ota").mkdir()
    replicas = []
    for index in range(count):
        port = free_port()
        config = root / f"replica-{index}.toml"
        config.write_text(
            f'repository = "{root / "models"}"\nstate = "{url}"\n'
            f'state_dir = "{root / f"state-{index}"}"\nota_repository = "{root / "ota"}"\n'
            f"http_port = {port}\ngrpc_port = 0\npoll_interval_s = 1.0\n"
            "[metrics]\npublic = true\n[connections]\nmax_connections = 2000\n"
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "cloud_gateway", "--config", str(config), "serve"],
            stdout=subprocess.DEVNULL,
            stderr=open(root / f"replica-{index}.log", "wb"),  # noqa: SIM115 - the child's
        )
        replicas.append((process, port))
    for process, port in replicas:
        end = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"a replica did not start (logs in {root})") from None
                time.sleep(0.1)
    return replicas


def state_queries(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("gateway_state_queries "):
                return float(line.split()[1])
    return 0.0


# -- the simulator --------------------------------------------------------------------------


class Pool:
    """Keep-alive HTTP/1.1 connections to the replicas; a request takes a free one."""

    def __init__(self, ports: list[int], per_replica: int) -> None:
        self.ports = ports
        self.per_replica = per_replica
        self.free: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter, int]] = (
            asyncio.Queue()
        )
        self.latencies: list[float] = []
        self.errors: list[str] = []

    async def open(self) -> None:
        for _ in range(self.per_replica):
            for port in self.ports:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                self.free.put_nowait((reader, writer, port))

    async def request(self, method: str, path: str, token: str, body: bytes = b"") -> Any:
        reader, writer, port = await self.free.get()
        started = time.perf_counter()
        try:
            try:
                head, answer = await self._exchange(reader, writer, port, method, path, token, body)
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                    raise
                # nothing came back: a pooled connection the gateway closed while it sat
                # idle past its keep-alive; once more on a new one, as a client's pool does
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                head, answer = await self._exchange(reader, writer, port, method, path, token, body)
            status = head[0].split()[1]
            if status != "200":
                self.errors.append(f"{method} {path}: {head[0]} {answer[:100]!r}")
                return None
            self.latencies.append(time.perf_counter() - started)
            return json.loads(answer)
        except (OSError, asyncio.IncompleteReadError, StopIteration) as exc:
            self.errors.append(f"{method} {path}: {exc!r}")
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            return None
        finally:
            self.free.put_nowait((reader, writer, port))

    @staticmethod
    async def _exchange(
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        port: int,
        method: str,
        path: str,
        token: str,
        body: bytes,
    ) -> tuple[list[str], bytes]:
        """One request on a connection: the answer's head lines and its body."""
        writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        length = next(
            int(line.split(":", 1)[1]) for line in head if line.lower().startswith("content-length")
        )
        return head, await reader.readexactly(length)

    def take(self) -> tuple[list[float], list[str]]:
        out = (self.latencies, self.errors)
        self.latencies, self.errors = [], []
        return out

    def close(self) -> None:
        while not self.free.empty():
            self.free.get_nowait()[1].close()


def _summary(latencies: list[float], errors: list[str], seconds: float) -> dict[str, Any]:
    values = np.asarray(latencies or [0.0]) * 1000
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "first_errors": errors[:3],
        "seconds": round(seconds, 2),
        "requests_per_s": round(len(latencies) / max(seconds, 1e-9), 1),
        "p50_ms": round(float(np.percentile(values, 50)), 2),
        "p99_ms": round(float(np.percentile(values, 99)), 2),
    }


INSTALLED: dict[str, int] = {}  # what each simulated device runs (by the simulator only)


async def _check(pool: Pool, device: str, token: str, report: bool) -> None:
    plan = await pool.request("GET", "/v2/ota/plan", token)
    if not report or plan is None:
        return
    for entry in plan["models"]:
        if INSTALLED.get(device) == entry["version"]:
            continue  # has it: nothing to install, nothing to report
        INSTALLED[device] = entry["version"]
        body = {"name": entry["name"], "version": entry["version"], "status": "installed",
                "serving": entry["version"]}  # fmt: skip
        await pool.request("POST", "/v2/ota/report", token, json.dumps(body).encode())


async def _spread(
    pool: Pool, devices: list[tuple[str, str]], seconds: float, *, report: bool, seed: int
) -> float:
    """Every device checks once at a random moment within ``seconds``; how long it took."""
    rng = random.Random(seed)
    moments = sorted((rng.uniform(0, seconds), d, t) for d, t in devices)
    started = time.perf_counter()
    tasks = []
    for at, device, token in moments:
        delay = at - (time.perf_counter() - started)
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_check(pool, device, token, report)))
    await asyncio.gather(*tasks)
    return time.perf_counter() - started


async def _rollout(
    pool: Pool, store: RolloutStore, devices: list[tuple[str, str]], percent: float,
    jitter: float, seed: int,
) -> dict[str, Any]:  # fmt: skip
    expected = sum(1 for d, _ in devices if in_slice(d, MODEL, percent))
    started = time.perf_counter()
    store.start(MODEL, 2, GROUP, percent, failure_threshold=1.0)
    checks = asyncio.create_task(_spread(pool, devices, jitter, report=True, seed=seed))
    installed, done_at = 0, None
    while done_at is None:
        await asyncio.sleep(0.2)
        installed = store.stats(MODEL, 2, GROUP)["installed"]
        if installed >= expected:
            done_at = time.perf_counter() - started
        elif checks.done() and installed < expected:
            break  # some failed: said in the errors
    await checks
    latencies, errors = pool.take()
    result = _summary(latencies, errors, time.perf_counter() - started)
    result.update({"percent": percent, "devices_in_slice": expected, "installed": installed,
                   "rollout_s": round(done_at, 2) if done_at is not None else None})  # fmt: skip
    return result


def _telemetry(port: int, devices: list[tuple[str, str]], connections: int = 8) -> dict[str, Any]:
    """One QoS 1 status message for each device, through a few connections: messages/s
    the broker acknowledged."""
    from edge_core.mqtt import new_client

    clients = []
    for index in range(connections):
        client = new_client(f"fleet-sim-{index}", None, None, None)
        client.connect("127.0.0.1", port)
        client.loop_start()
        clients.append(client)
    started = time.perf_counter()
    infos = []
    for index, (device, _) in enumerate(devices):
        # the agent's own status document (edge_agent/telemetry.py: flat, not wrapped),
        # which a gateway with a bridge keeps for its dashboard
        status = {"profile": "raspberry-pi-5", "interval_s": 30,
                  "models": {MODEL: {"version": 2, "variant": "tflite-int8"}}}  # fmt: skip
        payload = json.dumps(
            {"device": device, "seq": 1, "kind": "status", "time": time.time(), **status}
        )
        infos.append(
            clients[index % connections].publish(f"devices/{device}/telemetry/status", payload, 1)
        )
    for info in infos:
        info.wait_for_publish(30)
    seconds = time.perf_counter() - started
    for client in clients:
        client.loop_stop()
        client.disconnect()
    return {"messages": len(infos), "seconds": round(seconds, 2),
            "messages_per_s": round(len(infos) / seconds, 1)}  # fmt: skip


def _broker(root: Path) -> tuple[subprocess.Popen[bytes], int] | None:
    binary = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if os.path.exists("/usr/sbin/mosquitto") else None
    )
    if binary is None:
        return None
    port = free_port()
    config = root / "mosquitto.conf"
    config.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\n"
                      + ("user root\n" if os.geteuid() == 0 else ""))  # fmt: skip
    process = subprocess.Popen([binary, "-c", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(0.5)
    return process, port


async def _simulate(args: argparse.Namespace, root: Path, url: str, report: dict[str, Any]) -> None:
    database = open_state(url)
    devices = enroll(database, args.devices)
    store = RolloutStore(database)
    replicas = start_replicas(root, url, args.replicas)
    ports = [port for _, port in replicas]
    pool = Pool(ports, max(1, args.connections // len(ports)))
    try:
        await pool.open()
        interval = args.interval or args.devices / 200
        before = sum(state_queries(p) for p in ports)
        seconds = await _spread(pool, devices, interval, report=False, seed=1)
        after = sum(state_queries(p) for p in ports)
        latencies, errors = pool.take()
        steady = _summary(latencies, errors, seconds)
        per_check = (after - before) / max(len(latencies), 1)
        steady.update(
            {"offered_per_s": round(args.devices / interval, 1),
             "queries_per_check": round(per_check, 2)}
        )  # fmt: skip
        report["steady"] = steady
        report["rollouts"] = [
            await _rollout(pool, store, devices, percent, args.jitter, seed=2 + i)
            for i, percent in enumerate((10.0, 100.0))
        ]
        broker = None if args.no_telemetry else _broker(root)
        if broker is not None:
            try:
                report["telemetry"] = _telemetry(broker[1], devices)
            finally:
                stop_process(broker[0])
    finally:
        pool.close()
        for process, _ in replicas:
            stop_process(process)
        database.close()


def run_fleet(args: argparse.Namespace) -> int:
    report: dict[str, Any] = {
        "benchmark": "fleet",
        "machine": machine_info(),
        "devices": args.devices,
        "replicas": args.replicas,
        "state": describe(args.fleet_state) if args.fleet_state else "sqlite (embedded)",
        "command": f"python -m benchmarks fleet --devices {args.devices} --replicas "
        f"{args.replicas}" + (" --state URL" if args.fleet_state else ""),
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        url = args.fleet_state or f"sqlite:///{root / 'fleet.sqlite'}"
        asyncio.run(_simulate(args, root, url, report))
    summarize_fleet(report)
    publish(format_fleet(report), report, args.json)
    return 0


PLAN_DEVICES = 100_000
PLAN_ROLLOUT_S = 300.0  # a 100% rollout, announced, done within five minutes
PLAN_CHECK_S = 3600.0  # the agent's periodic check ([ota] interval_s)
PLAN_TELEMETRY_S = 30.0  # the agent's telemetry interval ([telemetry] interval_s)
# a report on a published version: two upserts (one transaction), the rollout read twice
# (one read more for a version only a rollout offers, as this benchmark's)
REPORT_QUERIES = 4


def plan_for(report: dict[str, Any], devices: int = PLAN_DEVICES) -> dict[str, Any]:
    """What ``devices`` need, scaled from this run: the rate one core of this machine
    sustained (the herd of the 100% rollout: checks and reports, with the replicas, the
    database and the simulator on the same cores, so a core of a replica alone does
    more), the statements per check, and the agent's default intervals."""
    full = report["rollouts"][-1]
    cores = max(int(report["machine"].get("cpus") or 1), 1)
    per_core = full["requests_per_s"] / cores  # requests (a check, or a report) a second
    needed = devices * 2 / PLAN_ROLLOUT_S  # a check and a report per device
    queries = report["steady"]["queries_per_check"]
    return {
        "devices": devices,
        "rollout_within_s": PLAN_ROLLOUT_S,
        "requests_per_s_needed": round(needed, 1),
        "measured_requests_per_s_per_core": round(per_core, 1),
        "gateway_cores": round(needed / max(per_core, 1e-9), 1),
        "replicas": max(2, math.ceil(needed / max(per_core, 1e-9) / 2)),  # 2 cores each
        "database_statements_per_s": round(needed / 2 * queries + needed / 2 * REPORT_QUERIES, 1),
        "steady_checks_per_s": round(devices / PLAN_CHECK_S, 1),
        "telemetry_messages_per_s": round(devices / PLAN_TELEMETRY_S, 1),
        "broker_connections": devices,
    }


def summarize_fleet(report: dict[str, Any]) -> None:
    report["plan_100k"] = plan_for(report)
    ten, full = report["rollouts"]
    report["summary"] = {
        "devices": report["devices"],
        "replicas": report["replicas"],
        "rollout_10_s": ten["rollout_s"],
        "rollout_100_s": full["rollout_s"],
        "requests_per_s": max(ten["requests_per_s"], full["requests_per_s"]),
        "p99_ms": max(report["steady"]["p99_ms"], ten["p99_ms"], full["p99_ms"]),
        "queries_per_check": report["steady"]["queries_per_check"],
        "errors": report["steady"]["errors"] + ten["errors"] + full["errors"],
    }


def format_fleet(report: dict[str, Any]) -> str:
    steady = report["steady"]
    rows = [
        [
            "steady state (each device checks once)",
            steady["requests"],
            steady["seconds"],
            steady["requests_per_s"],
            steady["p50_ms"],
            steady["p99_ms"],
            steady["errors"],
            "-",
        ]
    ]
    for r in report["rollouts"]:
        rows.append([f"rollout to {r['percent']:g}% ({r['devices_in_slice']} devices)",
                     r["requests"], r["seconds"], r["requests_per_s"], r["p50_ms"], r["p99_ms"],
                     r["errors"], r["rollout_s"]])  # fmt: skip
    lines = [
        f"fleet simulation: {report['devices']} devices, {report['replicas']} replica(s), "
        f"state {report['state']} ({report['machine']['cpus']} CPUs, shared by all)",
        render_table(
            ["phase", "requests", "s", "req/s", "p50 ms", "p99 ms", "errors", "rollout s"], rows
        ),
        f"database statements per update check: {steady['queries_per_check']} "
        f"(offered {steady['offered_per_s']} checks/s in the steady state)",
    ]
    plan = report.get("plan_100k")
    if plan:
        lines.append(
            f"scaled to {plan['devices']:,} devices (a 100% rollout within "
            f"{plan['rollout_within_s']:g} s: {plan['requests_per_s_needed']:g} requests/s; "
            f"measured {plan['measured_requests_per_s_per_core']:g}/s per core here): "
            f"{plan['gateway_cores']:g} gateway cores, {plan['replicas']} replicas of 2 cores; "
            f"the database {plan['database_statements_per_s']:g} statements/s at the peak, "
            f"{plan['steady_checks_per_s']:g} checks/s between rollouts; the broker "
            f"{plan['broker_connections']:,} connections, "
            f"{plan['telemetry_messages_per_s']:g} telemetry messages/s"
        )
    if "telemetry" in report:
        t = report["telemetry"]
        lines.append(f"telemetry: {t['messages']} QoS 1 messages in {t['seconds']} s "
                     f"({t['messages_per_s']}/s through the broker)")  # fmt: skip
    return "\n".join(lines)
