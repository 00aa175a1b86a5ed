"""``python -m benchmarks hybrid``: local-only, cloud-only and hybrid on the held-out digits.

One run, against a real gateway on loopback (``cloud-gateway serve`` in a
child process), the 360 held-out digits sent one by one through three agents:

- local-only: the light model on the device (``digits-light``), no gateway;
- cloud-only: every request offloaded to the heavy model (``digits-heavy``);
- hybrid: the light model answers, and escalates to the heavy one in the
  cloud when its top probability is below the policy's threshold.

For each: accuracy, the share offloaded, mean and p99 latency. Target: hybrid
accuracy within 0.5 point of cloud-only with at most 25% offloaded. Then the
hybrid run again, with the gateway killed (SIGKILL) halfway: every request
must still be answered, those that wanted the cloud marked degraded, none
past its deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.agent import Agent
from edge_agent.latency import kept_on_device, quiet_agent
from edge_agent.offload import ExitGuard, OffloadClient, make_transport
from edge_agent.offload.breaker import CircuitBreaker
from edge_agent.privacy import PrivacyInspector
from edge_agent.profiles.schema import DeviceProfile
from edge_core.processes import free_port, stop_process
from edge_core.report import machine_info, render_table
from edge_core.repository import ModelRepository

__all__ = ["bench_agent", "gateway_process", "run_hybrid"]

ACCURACY_TARGET_POINTS = 0.5
OFFLOAD_TARGET = 0.25


@contextlib.contextmanager
def gateway_process(
    repository: Path, state_dir: Path, *, extra_config: str = "", broker_files: Path | None = None
) -> Iterator[dict[str, Any]]:
    """``cloud-gateway serve`` in a child process, with one device ("bench-device",
    group "bench"); yields its ports, the device's token and the process.

    ``extra_config`` is appended to the gateway's configuration file (TOML);
    with ``broker_files``, ``cloud-gateway mqtt acl`` writes the broker's
    password and ACL files there before the gateway starts.
    """
    base = [sys.executable, "-m", "cloud_gateway", "--state-dir", str(state_dir)]
    added = subprocess.run(
        [*base, "device", "add", "bench-device", "--group", "bench"],
        capture_output=True,
        text=True,
        check=True,
    )
    if broker_files is not None:
        subprocess.run(
            [*base, "mqtt", "acl", "--out", str(broker_files)],
            capture_output=True,
            check=True,
        )
    http_port, grpc_port = free_port(), free_port()
    config = state_dir / "gateway.toml"
    config.write_text(
        f'repository = "{repository}"\nstate_dir = "{state_dir}"\n'
        f"http_port = {http_port}\ngrpc_port = {grpc_port}\n{extra_config}"
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "cloud_gateway", "--config", str(config), "serve"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        end = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the gateway exited: {process.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1
                ):
                    break
            except OSError:
                if time.monotonic() > end:
                    raise RuntimeError("the gateway did not become ready in 60 s") from None
                time.sleep(0.1)
        yield {
            "process": process,
            "token": added.stdout.strip(),
            "grpc": f"127.0.0.1:{grpc_port}",
            "http": f"127.0.0.1:{http_port}",
        }
    finally:
        stop_process(process)
        if process.stderr is not None:
            process.stderr.close()


def bench_agent(
    profile: DeviceProfile,
    repository: ModelRepository,
    address: str | None,
    token: str,
    *,
    escalate: bool,
    cooldown_s: float = 60.0,
    on_device: tuple[str, ...] = (),
) -> Agent:
    """An agent with the default policy on a quiet device (the benchmark is about
    accuracy), offloading over gRPC to ``address`` (none: local only);
    ``escalate=False`` keeps ``digits-light`` on the device, and so does ``on_device``
    for the models it names."""
    rules = kept_on_device(on_device if escalate else (*on_device, "digits-light"))
    offload = None
    if address is not None:
        offload = OffloadClient(
            make_transport("grpc", address, token=token),
            guard=ExitGuard(PrivacyInspector(None), rules),
            breaker=CircuitBreaker(failures=3, cooldown_s=cooldown_s),
            retries=1,
        )
    return quiet_agent(profile, repository, rules, offload)


def _run(
    agent: Agent,
    model: str,
    inputs: np.ndarray,
    labels: np.ndarray,
    deadline_ms: float,
    kill: Any = None,
) -> dict[str, Any]:
    latencies, correct, offloaded, degraded, errors, late = [], 0, 0, 0, 0, 0
    for index in range(len(labels)):
        if kill is not None and index == len(labels) // 2:
            kill()
        started = time.perf_counter()
        try:
            result = agent.infer(
                model, {"pixels": inputs[index : index + 1]}, deadline_ms=deadline_ms
            )
        except Exception:  # counted: the target is zero
            errors += 1
            latencies.append((time.perf_counter() - started) * 1000)
            continue
        latencies.append((time.perf_counter() - started) * 1000)
        late += latencies[-1] > deadline_ms
        correct += int(np.argmax(result.outputs["probabilities"]) == labels[index])
        offloaded += result.where == "cloud"
        degraded += result.degraded
    values = np.asarray(latencies)
    return {
        "requests": len(labels),
        "answered": len(labels) - errors,
        "errors": errors,
        "late": late,
        "accuracy": round(correct / len(labels), 4),
        "offloaded_share": round(offloaded / len(labels), 4),
        "degraded": degraded,
        "mean_ms": round(float(values.mean()), 3),
        "p99_ms": round(float(np.percentile(values, 99)), 3),
        "max_ms": round(float(values.max()), 3),
    }


def run_hybrid(
    profile: DeviceProfile, model_dir: Path, *, deadline_ms: float = 250.0
) -> dict[str, Any]:
    repository = ModelRepository(model_dir)
    inputs, labels = repository.get("digits-light").evaluation()
    inputs = inputs.astype(np.float32)
    threshold = kept_on_device(()).rule("digits-light").escalate_below
    report: dict[str, Any] = {
        "benchmark": "hybrid",
        "machine": machine_info(),
        "profile": profile.id,
        "deadline_ms": deadline_ms,
        "escalate_below": threshold,
        "setups": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        cloud_repo = Path(tmp) / "repo"
        cloud_repo.mkdir()
        (cloud_repo / "digits-heavy").symlink_to((Path(model_dir) / "digits-heavy").resolve())
        with gateway_process(cloud_repo, Path(tmp) / "state") as gateway:
            setups = [
                (
                    "local-only",
                    bench_agent(profile, repository, None, "", escalate=False),
                    "digits-light",
                ),
                (
                    "cloud-only",
                    bench_agent(
                        profile, repository, gateway["grpc"], gateway["token"], escalate=False
                    ),
                    "digits-heavy",
                ),
                (
                    "hybrid",
                    bench_agent(
                        profile, repository, gateway["grpc"], gateway["token"], escalate=True
                    ),
                    "digits-light",
                ),
            ]
            for name, agent, model in setups:
                agent.infer(model, {"pixels": inputs[:1]}, deadline_ms=5000)  # load and connect
                report["setups"][name] = _run(agent, model, inputs, labels, deadline_ms)
                if name == "hybrid":
                    report["setups"][name]["variant"] = agent.loaded()["digits-light"]["variant"]
                agent.close()
            hybrid = bench_agent(
                profile, repository, gateway["grpc"], gateway["token"], escalate=True
            )
            hybrid.infer("digits-light", {"pixels": inputs[:1]}, deadline_ms=5000)
            process = gateway["process"]

            def kill() -> None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()

            outage = _run(hybrid, "digits-light", inputs, labels, deadline_ms, kill=kill)
            outage["breaker_state"] = hybrid.offload.breaker.state if hybrid.offload else None
            outage["decisions"] = {
                f"{a}/{r}": n for (a, r), n in sorted(hybrid.stats.decisions.snapshot().items())
            }
            report["gateway_killed_halfway"] = outage
            hybrid.close()
    cloud = report["setups"]["cloud-only"]["accuracy"]
    hyb = report["setups"]["hybrid"]
    report["summary"] = {
        "hybrid_minus_cloud_points": round(100 * (hyb["accuracy"] - cloud), 2),
        "hybrid_offloaded_share": hyb["offloaded_share"],
        "meets_target": 100 * (cloud - hyb["accuracy"]) <= ACCURACY_TARGET_POINTS
        and hyb["offloaded_share"] <= OFFLOAD_TARGET,
        "all_answered_in_time_with_gateway_killed": report["gateway_killed_halfway"]["errors"] == 0
        and report["gateway_killed_halfway"]["late"] == 0,
    }
    return report


def _row(name: str, s: dict[str, Any]) -> list[Any]:
    return [
        name,
        round(100 * s["accuracy"], 2),
        round(100 * s["offloaded_share"], 1),
        s["mean_ms"],
        s["p99_ms"],
        s["errors"],
        s["late"],
    ]


def format_hybrid(report: dict[str, Any]) -> str:
    rows = [_row(name, s) for name, s in report["setups"].items()]
    outage = report["gateway_killed_halfway"]
    rows.append(_row("hybrid, gateway killed halfway", outage))
    summary = report["summary"]
    return "\n".join(
        [
            f"hybrid benchmark: {report['setups']['hybrid'].get('variant')} "
            f"on {report['profile']}, "
            f"escalating below {report['escalate_below']}; deadline {report['deadline_ms']:.0f} ms",
            render_table(
                ["setup", "accuracy %", "offloaded %", "mean ms", "p99 ms", "errors", "late"],
                rows,
            ),
            f"hybrid vs cloud-only: {summary['hybrid_minus_cloud_points']:+.2f} points with "
            f"{100 * summary['hybrid_offloaded_share']:.1f}% offloaded "
            f"(target: within {ACCURACY_TARGET_POINTS} point, <= {100 * OFFLOAD_TARGET:.0f}%): "
            f"{'met' if summary['meets_target'] else 'missed'}",
            f"gateway killed halfway: {outage['answered']}/{outage['requests']} answered, "
            f"{outage['late']} past the deadline, "
            f"{outage['degraded']} degraded, slowest {outage['max_ms']:.1f} ms, "
            f"breaker {outage['breaker_state']}",
        ]
    )
