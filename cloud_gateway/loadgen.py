"""A closed-loop load generator: N concurrent clients for a fixed time.

``cloud-gateway bench`` runs it against a running gateway (:func:`run_clients`); the
project's benchmarks (``benchmarks/``) run it as a separate process (``python -m
cloud_gateway.loadgen``) so that the clients do not share the interpreter of the
gateway they start; it prints one JSON object with the request count, errors and
latency percentiles.

Two kinds of client:

- ``raw`` (the default), in the manner of Triton's ``perf_analyzer``: each
  client encodes its request once, with the agent's own encoders (the
  protocol's protobuf message, or the HTTP binary tensor extension), and then
  only sends those bytes and reads and checks the answer (status, output
  tensor size). On a machine whose cores the clients share with the gateway,
  a cheap client leaves the CPU to the system under test, as remote clients
  would.
- ``tritonclient``: the stock ``tritonclient`` aio clients, which rebuild and
  decode every request in Python and so cost about as much CPU as the server;
  what ``python -m benchmarks peers`` uses, since every peer must take them.

``--pair-url URL`` measures what one server adds to another: one client sends to
``--url`` and to ``URL`` in turn, request by request, in alternating order, and
reports both and the median of the differences within the pairs (a drift of the
machine's speed slows both requests of a pair alike).

Within the timed run it also measures the CPU a request answered took: the
clients' own (``client_cpu_us_per_request``, every thread of this process) and,
with ``--cpu-of PID``, the server's (``server_cpu_us_per_request``: that process
and every process below it, from ``/proc``). On a machine whose cores clients and
server share, throughput is their CPU budget split between them: the two figures
say which side spends it.

Each client holds its own connection, as each device of a fleet does: HTTP
keep-alive, or a gRPC channel with its own subchannel pool (gRPC otherwise puts
every channel to the same address with the same settings on one shared TCP
connection, so that N clients were N streams of a single HTTP/2 connection).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from edge_core.processes import tree_cpu_seconds
from edge_core.protocol.rest import encode_infer_request
from edge_core.protocol.types import InferRequest

Send = Callable[[], Awaitable[None]]

# the longest a request may wait for its answer (a run always ends)
REQUEST_TIMEOUT_S = 10.0

# a connection of its own for each client's channel (see the module's docstring)
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


class BadAnswer(Exception):
    """The server answered, but not with the expected outputs."""


def _output_bytes(args: argparse.Namespace) -> int:
    return int(args.output_elements) * 4


def _request(args: argparse.Namespace, x: np.ndarray) -> InferRequest:
    return InferRequest(
        inputs={args.input: x}, datatypes={args.input: "FP32"}, model_name=args.model
    )


async def _grpc_raw(args: argparse.Namespace, x: np.ndarray) -> tuple[Send, Callable[[], Any]]:
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    from edge_core.protocol.grpc import request_to_proto

    body = request_to_proto(_request(args, x)).SerializeToString()
    channel = grpc.aio.insecure_channel(args.url, options=OWN_CONNECTION)
    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    metadata = (("authorization", f"Bearer {args.token}"),)
    expected = _output_bytes(args)

    async def send() -> None:
        answer = pb.ModelInferResponse.FromString(await infer(body, metadata=metadata))
        if sum(len(raw) for raw in answer.raw_output_contents) != expected:
            raise BadAnswer(f"unexpected outputs: {answer.outputs}")

    return send, channel.close


async def _http_raw(args: argparse.Namespace, x: np.ndarray) -> tuple[Send, Callable[[], Any]]:
    url = urlsplit(args.url if "://" in args.url else f"http://{args.url}")
    host, port = url.hostname or "127.0.0.1", url.port or 80
    # binary tensors, or JSON ones for an engine without the extension (MLServer)
    body, header_length = encode_infer_request(_request(args, x), binary=not args.json_tensors)
    binary = (
        "Content-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {header_length}\r\n"
    )
    head = (
        f"POST /v2/models/{args.model}/infer HTTP/1.1\r\n"
        f"Host: {f'[{host}]' if ':' in host else host}:{port}\r\n"
        f"Authorization: Bearer {args.token}\r\n"
        + (binary if header_length is not None else "Content-Type: application/json\r\n")
        + f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    message = head + body
    reader, writer = await asyncio.open_connection(host, port)
    expected = _output_bytes(args)

    async def send() -> None:
        writer.write(message)
        lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        fields = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in lines[1:] if line)
        }
        if "content-length" not in fields:  # the next answer could not be found
            raise OSError(f"an answer without Content-Length: {lines[0]}")
        body = await reader.readexactly(int(fields["content-length"]))
        if lines[0].split()[1] != "200":
            raise BadAnswer(f"{lines[0]}: {body[:200]!r}")
        json_size = int(fields.get("inference-header-content-length", len(body)))
        document = json.loads(body[:json_size])
        if json_size == len(body):  # JSON outputs
            if len(document["outputs"][0]["data"]) * 4 != expected:
                raise BadAnswer(f"unexpected outputs: {document['outputs']!r:.200}")
        elif len(body) - json_size != expected:
            raise BadAnswer(f"{len(body) - json_size} bytes of outputs, expected {expected}")

    def close() -> None:
        writer.close()

    return send, close


async def _stock(args: argparse.Namespace, x: np.ndarray) -> tuple[Send, Callable[[], Any]]:
    if args.protocol == "grpc":
        import tritonclient.grpc.aio as client_module
    else:
        import tritonclient.http.aio as client_module
    if args.protocol == "grpc":
        from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, KeepAliveOptions

        # tritonclient's own channel options (channel_args replaces them), and ours
        keepalive = KeepAliveOptions()
        stock = [
            ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
            ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ]
        client = client_module.InferenceServerClient(args.url, channel_args=stock + OWN_CONNECTION)
    else:
        client = client_module.InferenceServerClient(args.url)
    tensor = client_module.InferInput(args.input, list(x.shape), "FP32")
    outputs = None
    if args.protocol == "http":
        # JSON tensors both ways (an engine without the binary extension), or binary
        # ones both ways (tritonclient's default)
        binary = not args.json_tensors
        tensor.set_data_from_numpy(x, binary_data=binary)
        outputs = [client_module.InferRequestedOutput(args.output, binary_data=binary)]
    else:
        tensor.set_data_from_numpy(x)
    expected = int(args.output_elements)
    base = {"authorization": f"Bearer {args.token}"}
    if args.protocol == "http" and args.json_tensors:
        # tritonclient sends no Content-Type, and FastAPI servers (MLServer) leave a
        # body without application/json undecoded (422)
        base["content-type"] = "application/json"

    async def send() -> None:
        # fresh headers each time: the HTTP client adds to the dict it is given
        result = await client.infer(args.model, [tensor], outputs=outputs, headers=dict(base))
        answer = result.as_numpy(args.output)
        if answer is None or answer.size != expected:
            raise BadAnswer(f"unexpected outputs: {result.get_response()!r:.200}")

    return send, client.close


class RequestTimeout(TimeoutError):
    """No answer within the client's timeout: its connection is in an unknown state
    (an ``OSError``, so the client stops)."""


async def _connect(args: argparse.Namespace, x: np.ndarray) -> tuple[Send, Callable[[], Any]]:
    if args.client == "tritonclient":
        send, close = await _stock(args, x)
    else:
        send, close = await (_grpc_raw if args.protocol == "grpc" else _http_raw)(args, x)
    timeout = float(getattr(args, "timeout", REQUEST_TIMEOUT_S))

    async def bounded() -> None:
        try:
            await asyncio.wait_for(send(), timeout)
        except asyncio.TimeoutError:
            raise RequestTimeout(f"no answer within {timeout:g} s") from None

    return bounded, close


async def _worker(
    send: Send, stop: float, out: list[float] | None, errors: list[str] | None
) -> bool:
    """One client: request, wait for the answer, repeat until ``stop``. False when its
    connection is gone."""
    while time.perf_counter() < stop:
        started = time.perf_counter()
        try:
            await send()
            if out is not None:
                out.append(time.perf_counter() - started)
        except Exception as exc:  # counted and reported, never fatal to the run
            if errors is not None:
                errors.append(str(exc)[:200])
            if isinstance(exc, (OSError, asyncio.IncompleteReadError)):
                return False  # the connection is gone: this client stops
    return True


async def _paired(
    first: Send, second: Send, stop: float, errors: list[str]
) -> tuple[list[float], list[float]]:
    """One client sending to two servers in turn until ``stop``: each pair of requests
    a few milliseconds apart, in alternating order, so that a machine whose speed
    drifts slows both alike. The latencies of the pairs whose requests both succeeded."""
    times: tuple[list[float], list[float]] = ([], [])
    flip = False
    while time.perf_counter() < stop:
        order = ((1, second), (0, first)) if flip else ((0, first), (1, second))
        flip = not flip
        taken = [0.0, 0.0]
        try:
            for index, send in order:
                started = time.perf_counter()
                await send()
                taken[index] = time.perf_counter() - started
        except Exception as exc:  # counted and reported; the pair is dropped
            errors.append(str(exc)[:200])
            if isinstance(exc, (OSError, asyncio.IncompleteReadError)):
                break
            continue
        times[0].append(taken[0])
        times[1].append(taken[1])
    return times


async def _close_all(clients: list[tuple[Send, Callable[[], Any]]]) -> None:
    for _, close in clients:
        closing = close()
        if asyncio.iscoroutine(closing):
            await closing


def _figures(latencies: list[float], elapsed: float) -> dict[str, Any]:
    values = np.asarray(latencies) * 1000 if latencies else np.zeros(1)
    return {
        "requests": len(latencies),
        "seconds": round(elapsed, 3),
        "throughput_per_s": round(len(latencies) / elapsed, 1) if elapsed else 0.0,
        "p50_ms": round(float(np.percentile(values, 50)), 3),
        "p90_ms": round(float(np.percentile(values, 90)), 3),
        "p99_ms": round(float(np.percentile(values, 99)), 3),
        "max_ms": round(float(values.max()), 3),
        "mean_ms": round(float(values.mean()), 3),
    }


async def _run_paired(args: argparse.Namespace) -> dict[str, Any]:
    """``--pair-url``: one client, the two servers in turn (see :func:`_paired`); the
    first server's figures, the second's under ``pair``, and the median of the
    differences within each pair (second minus first) as ``added_p50_ms``."""
    x = np.load(args.data).astype(np.float32)[:1]
    other = argparse.Namespace(**{**vars(args), "url": args.pair_url, "token": args.pair_token})
    clients = [await _connect(args, x), await _connect(other, x)]
    errors: list[str] = []
    try:
        await _paired(clients[0][0], clients[1][0], time.perf_counter() + args.warmup, [])
        gc.freeze()
        started = time.perf_counter()
        first, second = await _paired(clients[0][0], clients[1][0], started + args.seconds, errors)
    finally:
        await _close_all(clients)
    # each path's figures as if it had the client to itself: its own time only
    report = {"errors": len(errors), "first_errors": errors[:3], **_figures(first, sum(first))}
    report["pair"] = _figures(second, sum(second))
    # no pair answered: nothing measured (never a 0 that would read as nothing added)
    differences = np.subtract(second, first) * 1000
    report["added_p50_ms"] = round(float(np.median(differences)), 3) if first else None
    return report


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    return await run_clients(args, np.load(args.data).astype(np.float32)[:1])


async def run_clients(args: argparse.Namespace, x: np.ndarray) -> dict[str, Any]:
    """``args.concurrency`` closed-loop clients sending the one-row input ``x`` for
    ``args.seconds`` (after ``args.warmup``): the run's figures (see :func:`main`'s
    options for what ``args`` holds)."""
    clients = [await _connect(args, x) for _ in range(args.concurrency)]
    latencies: list[float] = []
    errors: list[str] = []
    try:
        # warm up the connections the run then uses: none pays for connecting in it
        warmup_end = time.perf_counter() + args.warmup
        await asyncio.gather(*(_worker(send, warmup_end, None, None) for send, _ in clients))
        gc.freeze()  # the set-up is no garbage: collections during the run stay short
        server_cpu = tree_cpu_seconds(args.cpu_of) if args.cpu_of else None
        own_cpu = time.process_time()
        started = time.perf_counter()
        stop = started + args.seconds
        await asyncio.gather(*(_worker(send, stop, latencies, errors) for send, _ in clients))
        elapsed = time.perf_counter() - started
        own_cpu = time.process_time() - own_cpu
        if server_cpu is not None:
            after = tree_cpu_seconds(args.cpu_of)
            server_cpu = None if after is None else after - server_cpu
    finally:
        await _close_all(clients)
    report = {"errors": len(errors), "first_errors": errors[:3], **_figures(latencies, elapsed)}
    # CPU a request answered, within the timed run: these clients', and the server's
    # (its processes, when --cpu-of names it)
    if latencies:
        report["client_cpu_us_per_request"] = round(own_cpu / len(latencies) * 1e6, 1)
        if server_cpu is not None:
            report["server_cpu_us_per_request"] = round(server_cpu / len(latencies) * 1e6, 1)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--protocol", choices=["grpc", "http"], required=True)
    parser.add_argument("--client", choices=["raw", "tritonclient"], default="raw")
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--input", default="pixels")
    parser.add_argument("--output", default="probabilities", help="the output checked")
    parser.add_argument("--output-elements", type=int, default=10, help="FP32 values answered")
    parser.add_argument("--token", required=True)
    parser.add_argument("--data", required=True, help=".npy with one input row")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--cpus", help="run on these cores only, e.g. 0 or 0,1")
    parser.add_argument(
        "--json-tensors",
        action="store_true",
        help="HTTP: tensors as JSON, not binary (both clients, both directions)",
    )
    parser.add_argument(
        "--pair-url",
        help="one client, this server and --url in turn: the p50 one adds to the other",
    )
    parser.add_argument("--pair-token", help="the token for --pair-url (default: --token)")
    parser.add_argument(
        "--cpu-of",
        type=int,
        metavar="PID",
        help="report the CPU this process and those below it used a request (Linux)",
    )
    args = parser.parse_args(argv)
    if args.pair_url and args.concurrency != 1:
        parser.error("--pair-url measures one client: --concurrency 1")
    args.pair_token = args.pair_token or args.token
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    json.dump(asyncio.run((_run_paired if args.pair_url else _run)(args)), sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
