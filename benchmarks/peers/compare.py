"""``python -m benchmarks peers [--peers triton,mlserver]``: the gateway beside the servers users
would pick instead, on the same model, clients and cores, one server at a time (P2b).

In one run, for each server in turn (the order rotates from round to round with
``--rounds``), started here as child processes on the same model file:

- the gateway: ``cloud-gateway serve`` with its dynamic batching (or the code of
  another checkout too, ``--baseline DIR``, shown as ``gateway@baseline``: a before
  and an after in the same run);
- ``triton``: NVIDIA Triton through PyTriton 0.7.0 (Triton's C++ HTTP and gRPC front
  ends and dynamic batcher, the model in its Python backend calling ONNX Runtime:
  :mod:`benchmarks.peers.triton`);
- ``mlserver``: MLServer 1.7.1 with adaptive batching and a custom runtime calling
  ONNX Runtime (:mod:`benchmarks.peers.mlserver`).

Every server gets the same closed-loop clients, the stock ``tritonclient`` aio
clients that users have (:mod:`cloud_gateway.loadgen`; batch-1 requests, answers
checked), in four cases: gRPC with 1 client and with 64, HTTP with JSON tensors and
with binary tensors (the binary tensor extension) at 64. A case a server cannot take
(MLServer has no binary tensor extension) is said, not run. Peers are installed into
environments of their own on first use; one that cannot be installed is skipped with
the reason. Target at 64 clients: gRPC at least 1.05x the best peer's throughput,
HTTP at least 1.2x, p99 at most 50 ms; with one client, ahead of every peer.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.gateway.limits import add_case_arguments, load
from benchmarks.peers import PeerUnavailable
from benchmarks.peers import mlserver as mlserver_peer
from benchmarks.peers import triton as triton_peer
from benchmarks.peers.envs import wait_ready
from cloud_gateway import cpus
from cloud_gateway.auth import DeviceRegistry
from edge_core.package import ModelPackage
from edge_core.paths import default_model_dir
from edge_core.processes import free_port, stop_process
from edge_core.report import machine_info, publish, render_table
from edge_core.repository import ModelRepository

__all__ = ["PEERS", "format_peers", "register", "run_peers", "summarize_peers"]

PEERS = ("triton", "mlserver")
TARGET_P99_MS = 50.0
TARGET_RATIO = {"grpc": 1.05, "http": 1.2}  # over the best peer, at the most clients
GATEWAY = "gateway"
TITLES = {"triton": "Triton", "mlserver": "MLServer", GATEWAY: "gateway"}
# CPU a request took within the timed run (loadgen): the server's processes, the clients'
CPU_KEYS = ("server_cpu_us_per_request", "client_cpu_us_per_request")


@dataclass(frozen=True)
class Case:
    protocol: str  # grpc | http
    clients: int
    json_tensors: bool = False

    @property
    def label(self) -> str:
        kind = "gRPC" if self.protocol == "grpc" else (
            "HTTP JSON" if self.json_tensors else "HTTP binary"
        )  # fmt: skip
        return f"{kind}, {self.clients} client{'s' if self.clients > 1 else ''}"


def cases_for(clients: list[int]) -> list[Case]:
    """gRPC at each client count, HTTP (JSON and binary tensors) at the most."""
    top = max(clients)
    return [
        *(Case("grpc", c) for c in clients),
        Case("http", top, json_tensors=True),
        Case("http", top),
    ]


@dataclass
class Server:
    """A server under test, running: its process, ports and what it can take."""

    name: str
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    started_s: float
    extensions: tuple[str, ...]
    version: str

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.grpc_port if protocol == 'grpc' else self.http_port}"

    def cannot(self, case: Case) -> str | None:
        """Why this server cannot take ``case`` (``None``: it can)."""
        binary = case.protocol == "http" and not case.json_tensors
        if binary and "binary_tensor_data" not in self.extensions:
            return "no binary tensor extension"
        return None


def _metadata(http_port: int, token: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/v2", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        document: dict[str, Any] = json.loads(answer.read())
    return document


def knows_busy_delay(source: Path | None) -> bool:
    """Whether the gateway's code (this one, or the checkout ``source``) takes
    ``busy_delay_us``: a checkout from before it refuses the field, so its baseline runs
    without (the report says the gateway's own setting)."""
    if source is None:
        return True
    config = source / "cloud_gateway" / "config.py"
    return config.is_file() and "busy_delay_us" in config.read_text(encoding="utf-8")


def gateway_process(
    folder: Path,
    model_root: Path,
    *,
    threads: int,
    max_batch: int,
    delay_us: int,
    busy_delay_us: int = 0,
    on_cpus: frozenset[int] | None,
    source: Path | None = None,
    log: Path,
) -> tuple[subprocess.Popen[bytes], int, int, str]:
    """``cloud-gateway serve`` on one model with batching on, as a child process (the
    code of ``source``, a checkout, when given): its process, ports and a device token.

    Raises:
        PeerUnavailable: it did not become ready.
    """
    repo, state = folder / "repo", folder / "state"
    repo.mkdir(parents=True)
    (repo / model_root.parent.name).symlink_to(model_root.parent)
    http_port, grpc_port = free_port(), free_port()
    token = DeviceRegistry.add_to(f"sqlite:///{state / 'gateway.sqlite'}", "bench", "bench")
    config = folder / "gateway.toml"
    config.write_text(
        f'repository = "{repo}"\nstate_dir = "{state}"\n'
        f"http_port = {http_port}\ngrpc_port = {grpc_port}\npoll_interval_s = 0\n"
        f"workers = 1\nthreads = {threads}\n"
        f"[batching]\nmax_batch_size = {max_batch}\nmax_queue_delay_us = {delay_us}\n"
        # only when set: the code of a checkout from before it would refuse the field
        + (f"busy_delay_us = {busy_delay_us}\n" if busy_delay_us else "")
    )
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)
    process = subprocess.Popen(
        [sys.executable, "-m", "cloud_gateway", "--config", str(config), "serve"],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),  # noqa: SIM115 - the child holds it
        env=env,
        cwd=source or None,
        preexec_fn=(lambda: os.sched_setaffinity(0, on_cpus)) if on_cpus else None,
    )
    wait_ready(process, http_port, ["/v2/health/ready"], what="the gateway", log=log)
    return process, http_port, grpc_port, token


def _start(
    name: str, package: ModelPackage, args: argparse.Namespace, folder: Path, token: list[str]
) -> Server:
    """Start one server; ``token`` receives the gateway's device token (peers take any).

    Raises:
        PeerUnavailable: it cannot be installed or started.
    """
    folder.mkdir(parents=True)
    log = folder / "server.log"
    on_cpus = cpus.check(args.server_cpus) if args.server_cpus else None
    started = time.perf_counter()
    if name.startswith(GATEWAY):
        source = args.baseline if name.endswith("@baseline") else None
        process, http_port, grpc_port, key = gateway_process(
            folder, package.root, threads=args.threads, max_batch=args.max_batch,
            delay_us=args.delay_us, on_cpus=on_cpus, source=source, log=log,
            busy_delay_us=args.busy_delay_us if knows_busy_delay(source) else 0,
        )  # fmt: skip
        token[:] = [key]
    elif name == "triton":
        http_port, grpc_port = free_port(), free_port()
        process = triton_peer.start(
            folder, package.root, http_port, grpc_port, variant=args.variant,
            threads=args.threads, max_batch_size=args.max_batch, delay_us=args.delay_us,
            log=log, cpus=on_cpus,
        )  # fmt: skip
    elif name == "mlserver":
        http_port, grpc_port = free_port(), free_port()
        models = mlserver_peer.model_dir(
            folder / "models", package.root, args.variant, threads=args.threads,
            max_batch_size=args.max_batch, max_batch_time=args.mlserver_batch_ms / 1000,
        )  # fmt: skip
        process = mlserver_peer.start(models, http_port, grpc_port, log=log, cpus=on_cpus)
    else:
        raise PeerUnavailable(f"no peer named {name!r}: one of {', '.join(PEERS)}")
    elapsed = time.perf_counter() - started
    try:
        meta = _metadata(http_port, token[0] if token else "none")
    except OSError as exc:
        stop_process(process)
        raise PeerUnavailable(f"{name} does not answer its server metadata: {exc}") from exc
    return Server(
        name, process, http_port, grpc_port, round(elapsed, 1),
        tuple(meta.get("extensions", ())), f"{meta.get('name', name)} {meta.get('version', '')}",
    )  # fmt: skip


def _input_row(package: ModelPackage) -> np.ndarray[Any, Any]:
    if package.golden_file:
        row = next(iter(package.golden().inputs.values()))[:1]
    elif package.evaluation_file:
        row = package.evaluation()[0][:1]
    else:
        row = np.zeros([1, *[max(d, 1) for d in package.inputs[0].shape[1:]]])
    return np.asarray(row, dtype=np.float32)


def run_peers(args: argparse.Namespace) -> int:
    repository = args.repository or default_model_dir()
    try:
        package = ModelRepository(repository).get(args.model)
    except Exception as exc:
        hint = " (make it with `python tools/make_wide_mlp.py`)" if args.model == "wide-mlp" else ""
        print(f"cannot load model {args.model!r} from {repository}: {exc}{hint}", file=sys.stderr)
        return 1
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        print(f"unknown peer(s) {', '.join(unknown)}: choose from {', '.join(PEERS)}")
        return 2
    servers = [GATEWAY, *([f"{GATEWAY}@baseline"] if args.baseline else []), *peers]
    clients = [int(c) for c in args.concurrency.split(",")]
    cases = cases_for(clients)
    output = package.outputs[0]
    client_cpus = cpus.check(args.client_cpus) if args.client_cpus else None
    report: dict[str, Any] = {
        "benchmark": "peers",
        "model": package.name,
        "variant": args.variant,
        "machine": machine_info(),
        "command": f"python -m benchmarks peers --peers {','.join(peers)} --model {package.name} "
        f"--concurrency {args.concurrency} --seconds {args.seconds:g} --rounds {args.rounds}"
        + (f" --baseline {args.baseline}" if args.baseline else ""),
        "client": "tritonclient (stock aio clients, batch-1 requests)",
        "threads": args.threads,
        "max_batch_size": args.max_batch,
        "delay_us": args.delay_us,
        "busy_delay_us": args.busy_delay_us,
        "mlserver_batch_ms": args.mlserver_batch_ms,
        "server_cpus": sorted(args.server_cpus) if args.server_cpus else None,
        "client_cpus": sorted(client_cpus) if client_cpus else None,
        "seconds_per_case": args.seconds,
        "rounds": args.rounds,
        "servers": {},
        "cases": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        data = Path(tmp) / "input.npy"
        np.save(data, _input_row(package))
        for round_index in range(args.rounds):
            shift = round_index % len(servers)
            for name in servers[shift:] + servers[:shift]:
                if report["servers"].get(name, {}).get("skipped"):
                    continue
                _one_server(name, package, args, Path(tmp) / f"{name}-{round_index}", report,
                            cases, data, output.name, math.prod(output.shape[1:]), client_cpus,
                            round_index)  # fmt: skip
    summarize_peers(report)
    publish(format_peers(report), report, args.json)
    return 0


def _one_server(
    name: str,
    package: ModelPackage,
    args: argparse.Namespace,
    folder: Path,
    report: dict[str, Any],
    cases: list[Case],
    data: Path,
    output: str,
    output_elements: int,
    client_cpus: frozenset[int] | None,
    round_index: int,
) -> None:
    print(f"starting {name} ...", flush=True)
    token: list[str] = []
    try:
        server = _start(name, package, args, folder, token)
    except PeerUnavailable as exc:
        print(f"skipping {name}: {exc}", flush=True)
        report["servers"][name] = {"skipped": str(exc)}
        return
    report["servers"][name] = {
        "version": server.version,
        "started_s": server.started_s,
        "extensions": list(server.extensions),
    }
    try:
        for case in cases:
            entry: dict[str, Any] = {
                "server": name, "case": case.label, "protocol": case.protocol,
                "clients": case.clients, "json_tensors": case.json_tensors, "round": round_index,
            }  # fmt: skip
            why = server.cannot(case)
            if why is not None:
                report["cases"].append({**entry, "unsupported": why})
                continue
            print(f"{name}: {case.label} ...", flush=True)
            extra = ["--input", package.inputs[0].name, "--output", output]
            extra += ["--output-elements", str(output_elements)]
            extra += ["--cpu-of", str(server.process.pid)]
            if case.json_tensors:
                extra.append("--json-tensors")
            result = load(
                case.protocol, server.url(case.protocol), package.name,
                token[0] if token else "none", data, case.clients, args.seconds,
                "tritonclient", client_cpus, tuple(extra),
            )  # fmt: skip
            report["cases"].append({**entry, **result})
    finally:
        stop_process(server.process, timeout=30)


def _median(values: list[float]) -> float:
    return round(float(statistics.median(values)), 1 if max(values) > 10 else 3)


def summarize_peers(report: dict[str, Any]) -> None:
    """Per case: each server's median throughput and p99 over the rounds, the gateway
    over the best peer, and the target."""
    ran = [c for c in report["cases"] if "throughput_per_s" in c]
    labels = list(dict.fromkeys(c["case"] for c in report["cases"]))
    top = max((c["clients"] for c in report["cases"]), default=0)
    summary: dict[str, Any] = {"clients": top, "cases": {}}
    verdicts: list[bool] = []
    for label in labels:
        row: dict[str, Any] = {"servers": {}}
        sample = next(c for c in report["cases"] if c["case"] == label)
        for server in report["servers"]:
            mine = [c for c in ran if c["case"] == label and c["server"] == server]
            unsupported = next(
                (c["unsupported"] for c in report["cases"]
                 if c["case"] == label and c["server"] == server and "unsupported" in c),
                None,
            )  # fmt: skip
            if mine:
                row["servers"][server] = {
                    "throughput_per_s": _median([c["throughput_per_s"] for c in mine]),
                    "p99_ms": _median([c["p99_ms"] for c in mine]),
                    "errors": sum(c["errors"] for c in mine),
                }
                for key in CPU_KEYS:  # absent from reports made before they were measured
                    values = [c[key] for c in mine if key in c]
                    if values:
                        row["servers"][server][key] = _median(values)
            elif unsupported:
                row["servers"][server] = {"unsupported": unsupported}
        peers = {
            s: v for s, v in row["servers"].items()
            if not s.startswith(GATEWAY) and "throughput_per_s" in v and not v["errors"]
        }  # fmt: skip
        ours = row["servers"].get(GATEWAY, {})
        if peers and "throughput_per_s" in ours:
            best = max(peers, key=lambda s: peers[s]["throughput_per_s"])
            ratio = ours["throughput_per_s"] / peers[best]["throughput_per_s"]
            row["best_peer"] = best
            row["ratio"] = round(ratio, 2)
            if sample["clients"] == top:
                wanted = TARGET_RATIO[sample["protocol"]]
                row["target"] = f">= {wanted}x, p99 <= {TARGET_P99_MS:g} ms"
                row["meets_target"] = bool(
                    ratio >= wanted and ours["p99_ms"] <= TARGET_P99_MS and not ours["errors"]
                )
            else:
                row["target"] = "ahead of every peer"
                row["meets_target"] = bool(ratio > 1.0 and not ours["errors"])
            verdicts.append(row["meets_target"])
        summary["cases"][label] = row
    summary["meets_target"] = bool(verdicts) and all(verdicts)
    report["summary"] = summary


def _cell(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "–"
    if "unsupported" in entry:
        return f"fails ({entry['unsupported']})"
    text = f"{entry['throughput_per_s']:,.0f} ({entry['p99_ms']:.1f})"
    return text + (f", {entry['errors']} errors" if entry["errors"] else "")


def _cpu_cell(entry: dict[str, Any] | None) -> str:
    if not entry or CPU_KEYS[0] not in entry:
        return "–"
    return f"{entry[CPU_KEYS[0]]:,.0f} / {entry.get(CPU_KEYS[1], 0):,.0f}"


def format_peers(report: dict[str, Any]) -> str:
    servers = list(report["servers"])
    shown = [s for s in servers if not report["servers"][s].get("skipped")]
    titles: Callable[[str], str] = lambda s: TITLES.get(s, s)  # noqa: E731
    headers = ["case", *(f"{titles(s)} req/s (p99 ms)" for s in shown), "gateway / best peer"]
    rows = []
    for label, row in report["summary"]["cases"].items():
        ratio = f"{row['ratio']:.2f}x ({TITLES.get(row['best_peer'], row['best_peer'])})" if (
            "ratio" in row
        ) else "–"  # fmt: skip
        rows.append([label, *(_cell(row["servers"].get(s)) for s in shown), ratio])
    placement = "every process on every core"
    if report.get("server_cpus") or report.get("client_cpus"):
        placement = (
            f"servers on cores {report.get('server_cpus') or 'all'}, "
            f"clients on {report.get('client_cpus') or 'all'}"
        )
    lines = [
        f"peers: {report['model']} {report['variant']} ({report['machine']['cpus']} CPUs, "
        f"{placement}; {report['threads']} ONNX Runtime thread(s) each, batches up to "
        f"{report['max_batch_size']}, the gateway's busy_delay_us "
        f"{report.get('busy_delay_us', 0)}; {report['client']}; {report['seconds_per_case']:g} s a "
        f"case, {report['rounds']} round(s), medians)",
        "servers: "
        + "; ".join(
            f"{s}: {v['skipped']}"
            if v.get("skipped")
            else f"{s}: {v['version']}, ready in {v['started_s']} s"
            for s, v in report["servers"].items()
        ),
        render_table(headers, rows),
    ]
    cpu_rows = [
        [label, *(_cpu_cell(row["servers"].get(s)) for s in shown)]
        for label, row in report["summary"]["cases"].items()
    ]
    if any(cell != "–" for row in cpu_rows for cell in row[1:]):
        lines += [
            "CPU a request took, in us (medians): the server's processes / the clients'",
            render_table(["case", *(titles(s) for s in shown)], cpu_rows),
        ]
    for label, row in report["summary"]["cases"].items():
        if "meets_target" in row:
            lines.append(
                f"{label}: {'meets' if row['meets_target'] else 'misses'} the target "
                f"({row['target']})"
            )
    return "\n".join(lines)


def register(commands: Any) -> None:
    bench = commands.add_parser(
        "peers", help="the gateway beside Triton and MLServer, on the same model and clients"
    )
    add_case_arguments(
        bench,
        model="wide-mlp",
        variant="onnx-fp32",
        concurrency="1,64",
        threads=1,
        busy_delay_us=20_000,
    )
    group = bench.add_argument_group("peers")
    group.add_argument(
        "--peers",
        default=",".join(PEERS),
        help=f"compare with these servers (default: {','.join(PEERS)})",
    )
    group.add_argument("--rounds", type=int, default=1, help="rounds, the order rotated")
    group.add_argument(
        "--baseline", type=Path, help="also run the gateway from this checkout's code"
    )
    group.add_argument(
        "--mlserver-batch-ms", type=float, default=1.0, help="MLServer's max_batch_time"
    )
    group.add_argument(
        "--server-cpus", type=lambda s: [int(c) for c in s.split(",")],
        help="cores of every server (default: all)",
    )  # fmt: skip
    group.add_argument(
        "--client-cpus", type=lambda s: [int(c) for c in s.split(",")],
        help="cores of the clients (default: all)",
    )  # fmt: skip
    bench.set_defaults(run=run_peers)
