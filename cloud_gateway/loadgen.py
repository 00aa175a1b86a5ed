"""A closed-loop load generator: N concurrent stock Triton clients for a fixed time.

Run as a separate process by the benchmark (``python -m cloud_gateway.loadgen``)
so that the clients do not share the gateway's interpreter; prints one JSON
object with the request count, errors and latency percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import numpy as np


async def _worker(
    args: argparse.Namespace, x: np.ndarray, stop: float, out: list[float], errors: list[str]
) -> None:
    """One client: request, wait for the answer, repeat until ``stop``."""
    if args.protocol == "grpc":
        import tritonclient.grpc.aio as client_module
    else:
        import tritonclient.http.aio as client_module
    client = client_module.InferenceServerClient(args.url)
    tensor = client_module.InferInput(args.input, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    try:
        while time.perf_counter() < stop:
            started = time.perf_counter()
            try:
                # fresh headers each time: the HTTP client adds to the dict it is given
                await client.infer(
                    args.model, [tensor], headers={"authorization": f"Bearer {args.token}"}
                )
                out.append(time.perf_counter() - started)
            except Exception as exc:  # counted and reported, never fatal to the run
                errors.append(str(exc)[:200])
    finally:
        await client.close()


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    x = np.load(args.data).astype(np.float32)[:1]
    latencies: list[float] = []
    errors: list[str] = []
    warmup_end = time.perf_counter() + args.warmup
    await asyncio.gather(*(_worker(args, x, warmup_end, [], []) for _ in range(args.concurrency)))
    started = time.perf_counter()
    stop = started + args.seconds
    await asyncio.gather(
        *(_worker(args, x, stop, latencies, errors) for _ in range(args.concurrency))
    )
    elapsed = time.perf_counter() - started
    values = np.asarray(latencies) * 1000 if latencies else np.zeros(1)
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "first_errors": errors[:3],
        "seconds": round(elapsed, 3),
        "throughput_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(float(np.percentile(values, 50)), 3),
        "p99_ms": round(float(np.percentile(values, 99)), 3),
        "mean_ms": round(float(values.mean()), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--protocol", choices=["grpc", "http"], required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--input", default="pixels")
    parser.add_argument("--token", required=True)
    parser.add_argument("--data", required=True, help=".npy with one input row")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    args = parser.parse_args(argv)
    json.dump(asyncio.run(_run(args)), sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
