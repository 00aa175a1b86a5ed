"""``cloud-gateway bench``: load against a running gateway, in the manner of Triton's
``perf_analyzer``.

For each client count in turn, that many closed-loop clients (each on a connection of
its own, as devices are: :mod:`cloud_gateway.loadgen`) send one-row requests to the
model for ``--seconds`` and check every answer's size; the command prints requests/s
and latency percentiles a count, and writes them as JSON with ``--json``. The model's
input and output come from the gateway's own metadata (``/v2/models/NAME``, or the
gRPC ``ModelMetadata`` call), and the input is zeros unless ``--data`` gives a row.
The clients speak plain HTTP or gRPC: run it where the gateway's port is reached
without TLS (on its host, or inside its network).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import urllib.request
from pathlib import Path
from typing import Any

from edge_core.errors import ConfigError, EdgeError
from edge_core.report import machine_info, publish, render_table

__all__ = ["register"]


def register(commands: Any) -> None:
    bench = commands.add_parser(
        "bench", help="load against a running gateway: requests/s and latency per client count"
    )
    bench.add_argument("--url", required=True, help="the gateway, e.g. 127.0.0.1:8001")
    bench.add_argument("--model", required=True, help="the model to send requests to")
    bench.add_argument("--protocol", choices=["grpc", "http"], default="grpc", help="default: grpc")
    token = bench.add_mutually_exclusive_group(required=True)
    token.add_argument("--token", help="a device's token (cloud-gateway device add)")
    token.add_argument("--token-file", type=Path, help="a file holding the token")
    bench.add_argument("--concurrency", default="1,8,32", help="client counts (default: 1,8,32)")
    bench.add_argument("--seconds", type=_positive, default=3.0, help="seconds per client count")
    bench.add_argument("--warmup", type=float, default=0.5, help="seconds before each count")
    bench.add_argument("--data", type=Path, help=".npy whose first row is the input (FP32)")
    bench.add_argument(
        "--client",
        choices=["raw", "tritonclient"],
        default="raw",
        help="raw: requests encoded once, answers checked; tritonclient: the stock clients",
    )
    bench.add_argument(
        "--timeout", type=_positive, default=10.0,
        help="seconds a request may wait for its answer (default: 10); then its client stops",
    )  # fmt: skip
    bench.add_argument("--json", type=Path, help="write the results here")
    bench.set_defaults(run=_bench)


def _bench(args: argparse.Namespace) -> int:
    import numpy as np

    from cloud_gateway import loadgen

    if args.url.split("://", 1)[0] in ("https", "grpcs"):
        raise EdgeError(f"{args.url}: the load generator speaks plain HTTP and gRPC only")
    token = args.token or _read_token(args.token_file)
    counts = _counts(args.concurrency)
    described = _metadata(args.protocol, args.url, args.model, token)
    declared = [1, *described["input_shape"][1:]]  # -1: any size
    if args.data is None:
        x = np.zeros([max(d, 1) for d in declared], np.float32)
    else:
        x = _row(args.data, declared)
    shape = list(x.shape)
    base = {
        "protocol": args.protocol, "client": args.client, "url": args.url.split("://", 1)[-1],
        "model": args.model, "token": token, "input": described["input"],
        "output": described["output"], "output_elements": described["output_elements"],
        "seconds": args.seconds, "warmup": args.warmup, "json_tensors": False, "cpu_of": None,
        "timeout": args.timeout,
    }  # fmt: skip
    cases = []
    for count in counts:
        print(f"{args.protocol} clients={count} ...", flush=True)
        options = argparse.Namespace(**base, concurrency=count)
        cases.append({"clients": count, **asyncio.run(loadgen.run_clients(options, x))})
    report = {
        "benchmark": "load",
        "url": args.url,
        "protocol": args.protocol,
        "model": args.model,
        "client": args.client,
        "input": {"name": described["input"], "shape": shape, "zeros": args.data is None},
        "seconds_per_case": args.seconds,
        "machine": machine_info(),
        "cases": cases,
    }
    publish(format_load(report), report, args.json)
    return 0 if all(case["requests"] for case in cases) else 1


def format_load(report: dict[str, Any]) -> str:
    rows = [
        [c["clients"], c["throughput_per_s"], c["p50_ms"], c["p90_ms"], c["p99_ms"],
         c["max_ms"], c["errors"]]
        for c in report["cases"]
    ]  # fmt: skip
    headers = ["clients", "req/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors"]
    lines = [
        f"{report['model']} at {report['url']} over {report['protocol']} "
        f"({report['client']} clients, {report['seconds_per_case']:g} s a count)",
        render_table(headers, rows),
    ]
    for case in report["cases"]:
        for error in case["first_errors"][:1]:
            lines.append(f"{case['clients']} clients, first error: {error}")
    return "\n".join(lines)


def _read_token(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"--token-file {path}: {exc.strerror}") from exc


def _positive(text: str) -> float:
    """A finite number of seconds above zero (argparse says the value was wrong)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: must be above 0")
    return value


def _counts(text: str) -> list[int]:
    try:
        counts = [int(c) for c in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise ConfigError(f"--concurrency wants client counts of at least 1, got {text!r}")
    return counts


def _row(path: Path, shape: list[int]) -> Any:
    """The first row of ``path``, which must fit ``shape`` (a -1 there takes any size)."""
    import numpy as np

    try:
        row = np.load(path).astype(np.float32)[:1]
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--data {path}: not a readable .npy ({exc})") from exc
    if len(row.shape) != len(shape) or any(
        d not in (-1, r) for d, r in zip(shape, row.shape, strict=False)
    ):
        raise ConfigError(
            f"--data {path}: a row of shape {list(row.shape)}, the model takes {shape}"
        )
    return row


def _metadata(protocol: str, url: str, model: str, token: str) -> dict[str, Any]:
    """The model's first input (name, shape) and first output (name, elements a row),
    from the gateway.

    Raises:
        EdgeError: the gateway cannot be reached or does not serve ``model``, or its
            input is not FP32 (the clients send FP32).
    """
    try:
        if protocol == "http":
            document = _http_metadata(url, model, token)
        else:
            document = _grpc_metadata(url, model, token)
    except EdgeError:
        raise
    except Exception as exc:  # the transport's own errors, each said in one line
        raise EdgeError(f"the metadata of {model!r} from {url}: {_said(exc)}") from exc
    inputs, outputs = document.get("inputs") or [], document.get("outputs") or []
    if len(inputs) != 1 or not outputs:
        raise EdgeError(
            f"{model} has {len(inputs)} inputs and {len(outputs)} outputs: "
            "the load generator sends models of one input and reads their first output"
        )
    first, output = inputs[0], outputs[0]
    if first["datatype"] != "FP32":
        raise EdgeError(f"{model}'s input {first['name']} is {first['datatype']}: FP32 only")
    if any(int(d) < 0 for d in output["shape"][1:]):
        raise EdgeError(
            f"{model}'s output {output['name']} has a shape of {output['shape']}: its size "
            "a row must be known to check each answer"
        )
    elements = math.prod(int(d) for d in output["shape"][1:])
    return {
        "input": first["name"],
        "input_shape": [int(d) for d in first["shape"]],
        "output": output["name"],
        "output_elements": elements,
    }


def _said(exc: Exception) -> str:
    """A transport's error in one line: a gRPC status as its code and details."""
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if callable(code) and callable(details):  # grpc.RpcError
        return f"{code().name}: {details()}"
    return str(exc)


def _http_metadata(url: str, model: str, token: str) -> dict[str, Any]:
    base = url if "://" in url else f"http://{url}"
    request = urllib.request.Request(
        f"{base.rstrip('/')}/v2/models/{model}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return dict(json.load(answer))


def _grpc_metadata(url: str, model: str, token: str) -> dict[str, Any]:
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    target = url.split("://", 1)[-1]
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelMetadata",
            request_serializer=pb.ModelMetadataRequest.SerializeToString,
            response_deserializer=pb.ModelMetadataResponse.FromString,
        )
        answer = call(
            pb.ModelMetadataRequest(name=model),
            metadata=(("authorization", f"Bearer {token}"),),
            timeout=10,
        )
    return {
        side: [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in group]
        for side, group in (("inputs", answer.inputs), ("outputs", answer.outputs))
    }
