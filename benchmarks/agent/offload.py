"""``python -m benchmarks offload``: what an offload round trip costs over the floor.

One run on loopback, three paths interleaved request by request, each row of
``digits-heavy``'s held-out split sent once by each:

- echo: a bare gRPC echo server (:mod:`benchmarks.agent.grpc_echo`, in a child
  process, built as the gateway builds its gRPC server) sent the bytes of the
  same encoded ``ModelInferRequest`` (encoded before the clock starts): the
  transport's floor;
- transport: the agent's gRPC offload transport against ``cloud-gateway serve``
  (in a child process): encoding, the device token, the gateway's
  authentication, validation, batcher and ONNX Runtime, decoding;
- agent: ``Agent.infer`` for the cloud-placed model, as a local application's
  request goes: the policy's decision, the exit guard's privacy check, the
  offload client (breaker, estimates), the transport.

The order is drawn at random each round (seeded), so that no path always
follows the same one. The gateway's own compute time for the measured requests
is read from its ``/metrics`` (``gateway_compute_seconds``, its sum over its
count; a series that names no device, public with ``[metrics] public``) before
and after. Target (MISSION P5): the offload round trip at p50
within 1.5 times the echo's p50 plus that mean compute. Then the agent's own
share: the agent path again with the transport answering at once from a canned
response.
"""

from __future__ import annotations

import contextlib
import select
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.agent.grpc_echo import METHOD
from benchmarks.agent.hybrid import bench_agent, gateway_process
from edge_agent.offload.base import Transport
from edge_agent.profiles.schema import DeviceProfile
from edge_core.processes import stop_process
from edge_core.protocol.grpc import request_to_proto
from edge_core.protocol.types import InferRequest, InferResponse
from edge_core.report import machine_info, percentiles_ms, render_table
from edge_core.repository import ModelRepository

__all__ = ["format_offload", "run_offload"]

MODEL = "digits-heavy"
TARGET = 1.5
WARMUP = 50


@contextlib.contextmanager
def echo_server(timeout: float = 30.0) -> Iterator[str]:
    """The bare echo server in a child process; yields its address."""
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.agent.grpc_echo"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        try:
            assert process.stdout is not None
            ready, _, _ = select.select([process.stdout], [], [], timeout)
            line = process.stdout.readline().strip() if ready else ""
            if not line.isdigit():
                stderr.seek(0)
                why = stderr.read().decode(errors="replace")[-2000:]
                raise RuntimeError(
                    f"the echo server did not start within {timeout} s "
                    f"(exit status {process.poll()}): {why or 'nothing on stderr'}"
                )
            yield f"127.0.0.1:{line}"
        finally:
            stop_process(process)
            if process.stdout is not None:
                process.stdout.close()


def _compute_seconds(http: str) -> tuple[float, float]:
    """The gateway's ``gateway_compute_seconds`` sum and count for the model."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as response:
        text = response.read().decode()
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != "gateway_compute_seconds":
            continue
        for sample in family.samples:
            if sample.labels.get("model") != MODEL:
                continue
            if sample.name.endswith("_sum"):
                total = sample.value
            elif sample.name.endswith("_count"):
                count = sample.value
    return total, count


class _Paths:
    """The three ways one row goes out, each timed on its own."""

    def __init__(self, echo: Any, transport: Any, agent: Any, token: str) -> None:
        self._echo = echo
        self._transport = transport
        self._agent = agent
        self._metadata = [("authorization", f"Bearer {token}")]

    def echo(self, request: InferRequest, payload: bytes) -> None:
        """Bytes only: the request was encoded before the clock started."""
        if self._echo(payload, timeout=10, metadata=self._metadata) != payload:
            raise RuntimeError("the echo server changed the bytes")

    def transport(self, request: InferRequest, payload: bytes) -> None:
        self._transport.infer(request, timeout=10)

    def agent(self, request: InferRequest, payload: bytes) -> None:
        result = self._agent.infer(MODEL, request.inputs, deadline_ms=10_000)
        if result.where != "cloud" or result.degraded:
            raise RuntimeError(f"the agent did not offload: {result.decision}")


NAMES = ("echo", "transport", "agent")


class _Canned(Transport):
    """A transport that answers at once with a response it was given: what is left
    of the agent's offload path is the agent's own work."""

    name = "canned"

    def __init__(self, response: InferResponse) -> None:
        self.response = response

    def infer(
        self, request: InferRequest, *, timeout: float, request_id: str = ""
    ) -> InferResponse:
        return self.response


def _own_cost(agent: Any, inputs: np.ndarray[Any, Any], requests: int) -> list[int]:
    """The agent's offload path with the network taken out (a canned answer)."""
    assert agent.offload is not None
    real = agent.offload.transport
    row = {"pixels": inputs[:1]}
    agent.offload.transport = _Canned(real.infer(
        InferRequest(inputs=row, datatypes={"pixels": "FP32"}, model_name=MODEL), timeout=10
    ))  # fmt: skip
    samples = []
    try:
        for index in range(WARMUP + requests):
            row = {"pixels": inputs[index % len(inputs)][None, :]}
            started = time.perf_counter_ns()
            agent.infer(MODEL, row, deadline_ms=10_000)
            if index >= WARMUP:
                samples.append(time.perf_counter_ns() - started)
    finally:
        agent.offload.transport = real
    return samples


def run_offload(profile: DeviceProfile, model_dir: Path, *, requests: int = 1000) -> dict[str, Any]:
    import grpc

    repository = ModelRepository(model_dir)
    inputs = repository.get(MODEL).evaluation()[0].astype(np.float32)
    report: dict[str, Any] = {
        "benchmark": "offload",
        "machine": machine_info(),
        "profile": profile.id,
        "model": MODEL,
        "requests": requests,
        "target": TARGET,
    }
    samples: dict[str, list[int]] = {name: [] for name in NAMES}
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        cloud = Path(tmp) / "repo"
        cloud.mkdir()
        (cloud / MODEL).symlink_to((Path(model_dir) / MODEL).resolve())
        public = "[metrics]\npublic = true\n"
        with (
            gateway_process(cloud, Path(tmp) / "state", extra_config=public) as gateway,
            echo_server() as echo,
        ):
            token = gateway["token"]
            agent = bench_agent(profile, repository, gateway["grpc"], token, escalate=True)
            assert agent.offload is not None
            channel = grpc.insecure_channel(echo)
            paths = _Paths(channel.unary_unary(METHOD), agent.offload.transport, agent, token)
            try:
                for index in range(WARMUP + requests):
                    if index == WARMUP:  # connections, the batcher and the session are warm
                        before = _compute_seconds(gateway["http"])
                    request = InferRequest(
                        inputs={"pixels": inputs[index % len(inputs)][None, :]},
                        datatypes={"pixels": "FP32"},
                        model_name=MODEL,
                    )
                    payload = request_to_proto(request).SerializeToString()
                    # interleaved, in a random order each round: none always follows
                    # the same one (the gateway may still be busy with the last answer)
                    for name in (NAMES[i] for i in rng.permutation(len(NAMES))):
                        started = time.perf_counter_ns()
                        getattr(paths, name)(request, payload)
                        if index >= WARMUP:
                            samples[name].append(time.perf_counter_ns() - started)
                after = _compute_seconds(gateway["http"])
                own = _own_cost(agent, inputs, requests)
            finally:
                channel.close()
                agent.offload.close()
    runs = after[1] - before[1]
    compute_ms = (after[0] - before[0]) / runs * 1000 if runs else float("nan")
    paths_ms = {name: percentiles_ms(values) for name, values in samples.items()}
    floor = paths_ms["echo"]["p50_ms"] + compute_ms
    report["paths"] = paths_ms
    report["gateway_compute_ms"] = round(compute_ms, 4)
    report["gateway_runs"] = int(runs)
    report["floor_p50_ms"] = round(floor, 4)
    report["ratios"] = {
        name: round(paths_ms[name]["p50_ms"] / floor, 3) for name in ("transport", "agent")
    }
    report["meets_target"] = all(ratio <= TARGET for ratio in report["ratios"].values())
    report["agent_own"] = percentiles_ms(own)
    return report


def format_offload(report: dict[str, Any]) -> str:
    paths = report["paths"]
    rows = [
        [
            name,
            paths[name]["p50_ms"],
            paths[name]["p99_ms"],
            paths[name]["mean_ms"],
            report["ratios"].get(name),
        ]
        for name in ("echo", "transport", "agent")
    ]
    verdict = "meets" if report["meets_target"] else "MISSES"
    return "\n".join(
        [
            f"offload round trip over gRPC on loopback: {report['model']}, 1 row, "
            f"{report['requests']} requests each, interleaved",
            render_table(["path", "p50 ms", "p99 ms", "mean ms", "p50 / floor"], rows),
            f"gateway compute: {report['gateway_compute_ms']} ms a run (its own metrics, "
            f"{report['gateway_runs']} runs); floor = echo p50 + compute = "
            f"{report['floor_p50_ms']} ms",
            f"target: p50 within {report['target']}x the floor: {verdict}",
            f"the agent's own work on this path (a canned answer for the network): "
            f"p50 {report['agent_own']['p50_ms'] * 1000:.1f} µs, "
            f"p99 {report['agent_own']['p99_ms'] * 1000:.1f} µs",
        ]
    )
