"""``python -m benchmarks gateway``: the gateway under concurrent load, against its two limits.

(About 400 lines: the run's cases, limits and report together.)

In one run, on loopback:

1. the model alone: items/s at its best batch size, no server (limit 1);
2. the front end alone: the same server and clients with a no-op model that
   answers zeros at once (limit 2);
3. the gateway serving the model with 1, 8, 32 and 64 concurrent clients over
   gRPC and HTTP, with dynamic batching on and off.

Clients run in a separate process (:mod:`cloud_gateway.loadgen`), closed loop:
each sends its next request when the last one is answered. Prints a table,
writes JSON and a PNG chart. Target at 64 clients: throughput with batching
>= 70% of the lower limit, p99 <= 50 ms.

Each limit is measured on the cores its stage gets in the run. By default the
gateway runs inference on the upper half of the cores (``inference_cpus``, see
:mod:`cloud_gateway.cpus`) and its front ends, with the clients, on the rest,
as a cloud server runs its model on an accelerator and its front end on the
host: the model alone runs on the inference cores, the front end alone on the
others, and the gateway pipelines the two. With ``--inference-cpus none``
every thread shares every core; a request then costs the CPU of both limits,
so the rate cannot pass ``1 / (1/front + 1/model)``, and the report gives that
bound instead.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from cloud_gateway import cpus
from cloud_gateway.auth import DeviceRegistry
from cloud_gateway.config import BatchingSettings, GatewayConfig
from cloud_gateway.repository import Backend, EmbeddedBackend, LoadedModel
from cloud_gateway.server import GatewayThread
from edge_core.package import ModelPackage
from edge_core.paths import default_model_dir
from edge_core.report import machine_info, publish, render_table
from edge_core.repository import ModelRepository
from edge_core.runtime import RuntimeOptions, open_variant

__all__ = ["add_case_arguments", "inference_cores", "load", "register", "run_from_args"]

TARGET_SHARE = 0.70
TARGET_P99_MS = 50.0


def add_case_arguments(
    parser: argparse.ArgumentParser,
    *,
    model: str,
    variant: str,
    concurrency: str,
    threads: int | None,
    busy_delay_us: int,
) -> None:
    """The model, the clients and the batching of the gateway's case, with the
    defaults of the benchmark that reads them (this one, or the peers')."""
    parser.add_argument("--model", default=model, help=f"default: {model}")
    parser.add_argument(
        "--repository", type=Path, help="model repository (default: the sample models)"
    )
    parser.add_argument("--variant", default=variant, help=f"variant served (default: {variant})")
    parser.add_argument(
        "--concurrency", default=concurrency, help=f"client counts (default: {concurrency})"
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per case")
    parser.add_argument(
        "--threads",
        type=int,
        default=threads,
        help=f"runtime threads per inference (default: {threads or 'the inference cores'})",
    )
    parser.add_argument("--max-batch", type=int, default=64, help="max_batch_size with batching on")
    parser.add_argument(
        "--delay-us", type=int, default=0, help="max_queue_delay_us with batching on"
    )
    parser.add_argument(
        "--busy-delay-us",
        type=int,
        default=busy_delay_us,
        help=f"the gateway's busy_delay_us with batching on (default: {busy_delay_us})",
    )
    parser.add_argument("--json", type=Path, help="write the results here")


def register(commands: Any) -> None:
    bench = commands.add_parser(
        "gateway", help="the gateway under concurrent load, against its two limits"
    )
    add_case_arguments(
        bench,
        model="digits-heavy",
        variant="onnx-int8",
        concurrency="1,8,32,64",
        threads=None,
        busy_delay_us=0,
    )
    bench.add_argument(
        "--inference-cpus",
        default="auto",
        help="cores for inference, e.g. 1 or 2,3; the front ends and clients get the others "
        "(auto: the upper half of the cores; none: every thread on every core)",
    )
    bench.add_argument(
        "--client",
        choices=["raw", "tritonclient"],
        default="raw",
        help="raw: pre-encoded requests, answers checked (like perf_analyzer); "
        "tritonclient: the stock aio clients",
    )
    bench.add_argument("--workers", type=int, default=1, help="inference threads of the gateway")
    bench.add_argument("--spinning", action="store_true", help="let ONNX Runtime's threads spin")
    bench.add_argument(
        "--chart", type=Path, help="draw throughput and p99 against concurrency (PNG)"
    )
    bench.set_defaults(run=run_from_args)


class NoOpBackend:
    """Answers zeros of the model's output shapes at once: the front end's own cost."""

    def load(self, package: ModelPackage) -> LoadedModel:
        outputs = package.outputs

        def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            rows = next(iter(feed.values())).shape[0]
            return {
                spec.name: np.zeros((rows, *[max(d, 1) for d in spec.shape[1:]]), spec.dtype)
                for spec in outputs
            }

        return LoadedModel(
            package=package,
            variant="noop",
            platform="noop",
            device="none",
            inputs=package.inputs,
            outputs=outputs,
            run=run,
        )


def model_alone(
    package: ModelPackage, variant: str, options: RuntimeOptions, x: np.ndarray
) -> dict[str, Any]:
    """Items/s of the bare session at several batch sizes (limit 1)."""
    session = open_variant(package, package.variant(variant), options)
    name = package.inputs[0].name
    by_batch = {}
    for batch in (1, 8, 16, 32, 64, 128):
        feed = {name: np.repeat(x, batch, axis=0)}
        session.run(feed)
        count = 0
        started = time.perf_counter()
        while time.perf_counter() - started < 1.0:
            session.run(feed)
            count += 1
        by_batch[batch] = round(count * batch / (time.perf_counter() - started), 1)
    best = max(by_batch, key=lambda b: by_batch[b])
    return {"items_per_s_by_batch": by_batch, "best_batch": best, "items_per_s": by_batch[best]}


def load(
    protocol: str,
    url: str,
    model: str,
    token: str,
    data: Path,
    concurrency: int,
    seconds: float,
    client: str = "raw",
    on_cpus: frozenset[int] | None = None,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "cloud_gateway.loadgen",
        "--protocol",
        protocol,
        "--url",
        url,
        "--model",
        model,
        "--token",
        token,
        "--data",
        str(data),
        "--concurrency",
        str(concurrency),
        "--seconds",
        str(seconds),
        "--client",
        client,
        *(["--cpus", ",".join(map(str, sorted(on_cpus)))] if on_cpus else []),
        *extra,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 120)
    if result.returncode != 0:
        raise RuntimeError(f"load generator failed: {result.stderr[-2000:]}")
    return dict(json.loads(result.stdout))


def inference_cores(spec: str) -> frozenset[int] | None:
    """``--inference-cpus``: auto (the upper half of the cores, when there are two or
    more), none, or a comma-separated list."""
    if spec == "none":
        return None
    if spec == "auto":
        cores = sorted(cpus.available())
        return frozenset(cores[len(cores) - len(cores) // 2 :]) if len(cores) > 1 else None
    return cpus.check([int(c) for c in spec.split(",")])


def run_from_args(args: argparse.Namespace) -> int:
    repository = args.repository or default_model_dir()
    package = ModelRepository(repository).get(args.model)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    inference = inference_cores(args.inference_cpus)
    front = None if inference is None else cpus.others(inference)
    threads = args.threads or (len(inference) if inference else len(cpus.available()))
    options = RuntimeOptions(threads=threads, warmup=5, allow_spinning=args.spinning)
    x = (
        package.evaluation()[0][:1].astype(np.float32)
        if package.evaluation_file
        else np.zeros([1, *[max(d, 1) for d in package.inputs[0].shape[1:]]], np.float32)
    )
    report: dict[str, Any] = {
        "benchmark": "gateway",
        "model": package.name,
        "variant": args.variant,
        "machine": machine_info(),
        "threads": threads,
        "workers": args.workers,
        "inference_cpus": sorted(inference) if inference else None,
        "front_end_cpus": sorted(front) if front else None,
        "client": args.client,
        "seconds_per_case": args.seconds,
        "batching": {
            "max_batch_size": args.max_batch,
            "max_queue_delay_us": args.delay_us,
            "busy_delay_us": args.busy_delay_us,
        },
        "cases": [],
    }
    print(f"model alone ({package.name} {args.variant}, {threads} threads) ...", flush=True)
    with cpus.pinned(inference):
        report["model_alone"] = model_alone(package, args.variant, options, x)
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        data = state / "input.npy"
        np.save(data, x)
        base = GatewayConfig(
            repository=state / "repo",
            state_dir=state,
            http_port=0,
            grpc_port=0,
            poll_interval_s=0.0,
            workers=args.workers,
            runtime=options,
            inference_cpus=tuple(sorted(inference)) if inference else None,
        )
        (state / "repo").mkdir()
        (state / "repo" / package.name).symlink_to(package.root.parent)
        token = DeviceRegistry.add_to(base.state_url, "bench", "bench")
        batching_on = BatchingSettings(
            max_batch_size=args.max_batch,
            max_queue_delay_us=args.delay_us,
            busy_delay_us=args.busy_delay_us,
        )
        setups: list[tuple[str, bool, Backend]] = [
            ("noop", True, NoOpBackend()),
            ("model", True, EmbeddedBackend(options, variant=args.variant)),
            ("model", False, EmbeddedBackend(options, variant=args.variant)),
        ]
        for kind, batching, backend in setups:
            config = replace(base, batching=replace(batching_on, enabled=batching))
            gateway = GatewayThread(config, backend=backend)
            gc.freeze()  # as `cloud-gateway serve` does once it has started
            try:
                levels = [max(concurrencies)] if kind == "noop" else concurrencies
                for protocol in ("grpc", "http"):
                    url = gateway.grpc_url if protocol == "grpc" else gateway.http_url
                    for concurrency in levels:
                        switch = "on" if batching else "off"
                        print(
                            f"{kind} {protocol} batching={switch} clients={concurrency} ...",
                            flush=True,
                        )
                        result = load(
                            protocol,
                            url,
                            package.name,
                            token,
                            data,
                            concurrency,
                            args.seconds,
                            args.client,
                            front,
                        )
                        report["cases"].append(
                            {
                                "kind": kind,
                                "protocol": protocol,
                                "batching": batching,
                                "clients": concurrency,
                                **result,
                            }
                        )
            finally:
                gateway.stop()
    summarize(report)
    publish(format_report(report), report, args.json)
    if args.chart:
        draw_chart(report, args.chart)
        print(f"wrote {args.chart}")
    return 0


def summarize(report: dict[str, Any]) -> None:
    top = max(c["clients"] for c in report["cases"])
    model_limit = report["model_alone"]["items_per_s"]
    summary: dict[str, Any] = {"clients": top, "model_alone_per_s": model_limit}
    for protocol in ("grpc", "http"):

        def find(kind: str, batching: bool, protocol: str = protocol) -> dict[str, Any]:
            wanted = (kind, protocol, batching, top)
            return next(
                c
                for c in report["cases"]
                if (c["kind"], c["protocol"], c["batching"], c["clients"]) == wanted
            )

        front = find("noop", True)["throughput_per_s"]
        on, off = find("model", True), find("model", False)
        lower = min(model_limit, front)
        summary[protocol] = {
            "front_end_alone_per_s": front,
            "lower_limit_per_s": lower,
            "batching_per_s": on["throughput_per_s"],
            "batching_p99_ms": on["p99_ms"],
            "per_request_per_s": off["throughput_per_s"],
            "per_request_p99_ms": off["p99_ms"],
            "share_of_lower_limit": round(on["throughput_per_s"] / lower, 3),
            "gain_over_per_request": round(on["throughput_per_s"] / off["throughput_per_s"], 2),
            "meets_target": on["throughput_per_s"] >= TARGET_SHARE * lower
            and on["p99_ms"] <= TARGET_P99_MS,
        }
        if report.get("inference_cpus") is None:
            # Clients, front end and model share every core: each request costs
            # 1/front + 1/model of the CPU, so together they cannot pass this rate.
            shared = 1.0 / (1.0 / front + 1.0 / model_limit)
            summary[protocol]["shared_cpu_bound_per_s"] = round(shared, 1)
            summary[protocol]["share_of_shared_cpu_bound"] = round(
                on["throughput_per_s"] / shared, 3
            )
    report["summary"] = summary


def format_report(report: dict[str, Any]) -> str:
    rows = [
        [
            c["kind"],
            c["protocol"],
            "on" if c["batching"] else "off",
            c["clients"],
            c["throughput_per_s"],
            c["p50_ms"],
            c["p99_ms"],
            c["errors"],
        ]
        for c in report["cases"]
    ]
    alone = report["model_alone"]
    if report.get("inference_cpus"):
        placement = (
            f"inference on cores {report['inference_cpus']}, "
            f"front ends and clients on {report['front_end_cpus']}"
        )
    else:
        placement = "every thread on every core"
    lines = [
        f"gateway benchmark: {report['model']} {report['variant']} "
        f"({report['machine']['cpus']} CPUs, {placement}; {report['threads']} runtime "
        f"threads, {report['workers']} worker(s); {report.get('client', 'tritonclient')} "
        "clients)",
        "model alone: "
        + ", ".join(f"b{b} {v:.0f}/s" for b, v in alone["items_per_s_by_batch"].items())
        + f" (best: batch {alone['best_batch']})",
        render_table(
            ["server", "protocol", "batching", "clients", "req/s", "p50 ms", "p99 ms", "errors"],
            rows,
        ),
    ]
    summary = report["summary"]
    for protocol in ("grpc", "http"):
        s = summary[protocol]
        lines.append(
            f"{protocol} at {summary['clients']} clients: batching {s['batching_per_s']:.0f}/s = "
            f"{100 * s['share_of_lower_limit']:.0f}% of the lower limit "
            f"({s['lower_limit_per_s']:.0f}/s: model alone {summary['model_alone_per_s']:.0f}, "
            f"front end alone {s['front_end_alone_per_s']:.0f}), "
            f"p99 {s['batching_p99_ms']:.1f} ms; {s['gain_over_per_request']}x per-request; "
            + (
                f"{100 * s['share_of_shared_cpu_bound']:.0f}% of the shared-CPU bound "
                f"{s['shared_cpu_bound_per_s']:.0f}/s "
                if "shared_cpu_bound_per_s" in s
                else ""
            )
            + f"({'meets' if s['meets_target'] else 'misses'} the target: >= 70%, p99 <= 50 ms)"
        )
    return "\n".join(lines)


def draw_chart(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for protocol, style in (("grpc", "-"), ("http", "--")):
        for batching, colour in ((True, "tab:blue"), (False, "tab:orange")):
            cases = sorted(
                (
                    c
                    for c in report["cases"]
                    if c["kind"] == "model"
                    and c["protocol"] == protocol
                    and c["batching"] == batching
                ),
                key=lambda c: c["clients"],
            )
            label = f"{protocol}, batching {'on' if batching else 'off'}"
            xs = [c["clients"] for c in cases]
            left.plot(
                xs,
                [c["throughput_per_s"] for c in cases],
                style,
                color=colour,
                marker="o",
                label=label,
            )
            right.plot(
                xs, [c["p99_ms"] for c in cases], style, color=colour, marker="o", label=label
            )
    left.axhline(
        report["model_alone"]["items_per_s"],
        color="grey",
        linestyle=":",
        label="model alone (best batch)",
    )
    for protocol, style in (("grpc", "-."), ("http", ":")):
        left.axhline(
            report["summary"][protocol]["front_end_alone_per_s"],
            color="green",
            linestyle=style,
            label=f"front end alone ({protocol})",
        )
    right.axhline(TARGET_P99_MS, color="red", linestyle=":", label="p99 target")
    left.set(
        xlabel="concurrent clients", ylabel="requests / s", title=f"throughput, {report['model']}"
    )
    right.set(xlabel="concurrent clients", ylabel="p99 latency (ms)", title="p99 latency")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.grid(alpha=0.3)
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
