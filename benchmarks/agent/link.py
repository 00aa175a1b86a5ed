"""``python -m benchmarks offload --link 10,25,100``: offload sized for the link (P13).

The benchmark runs itself again in a network namespace of its own (``unshare -n``, as
root): only a loopback there, of MTU 1500, whose rate a ``tbf`` qdisc limits (``tc``).
This kernel has no ``netem``: the round trip (``--rtt-ms``, default 40) is added at the
transport seam, by a transport that waits half of it before each exchange and half
after. Requests and answers share the one qdisc: a link of that rate, one way at a
time (a closed loop sends one request at a time).

A gateway (``cloud-gateway serve``, a child process in the namespace) serves PP-OCR's
text detector; the agent (this process, the shipped policy and defaults) offloads the
evaluation pictures (scikit-image's photographs without faces, 640x480) to it. Rows, at
each rate:

- ``tensor``: what the agent sent before (a gateway that lists neither ``edge_pictures``
  nor ``edge_compression``): the FP32 input tensor up, the FP32 map down;
- ``encoded``: the shipped defaults: a JPEG at quality 90 up, the map packed down;
- ``encoded q50`` (a tuned setting, labelled): the policy's quality at 50.

Per row: bytes a picture each way, the round trip's p50 and p90 (a deadline of 30 s,
so that every answer comes), the answers matched against the tensor's (the text
boxes' mean IoU, one to one, best first), and at the default deadline (1000 ms) what
became of each request: answered by the cloud in time, missed (the fallback answered
late or failed), or answered here up front because the link's estimate said the cloud
would miss it. Then the link's rate changes (100 to 2 Mbit/s, ``--change``) and the
agent's estimate of it is printed after each request. Before the link, the JPEG
qualities are swept with no link at all: the boxes' IoU at each against the tensor's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.agent.hybrid import gateway_process
from edge_agent.agent import DEFAULT_POLICY, Agent
from edge_agent.offload import CircuitBreaker, ExitGuard, OffloadClient, make_transport
from edge_agent.offload.base import Transport
from edge_agent.policy import load_policy
from edge_agent.privacy import PrivacyInspector
from edge_agent.profiles.schema import DeviceProfile
from edge_agent.profiles.state import DeviceState
from edge_core.errors import EdgeError
from edge_core.protocol.types import InferRequest, InferResponse
from edge_core.report import machine_info, render_table
from edge_core.repository import ModelRepository

__all__ = ["LinkSettings", "format_link", "run_link"]

MODEL = "ppocr-det"
INSIDE = "EDGE_BENCH_LINK_NAMESPACE"  # set in the namespace's run
PICTURES = (
    "text", "page", "coffee", "chelsea", "rocket", "hubble_deep_field", "coins",
    "immunohistochemistry",
)  # fmt: skip
DEFAULT_DEADLINE_MS = 1000.0
LONG_DEADLINE_MS = 30_000.0


@dataclass(frozen=True)
class LinkSettings:
    rates_mbit: tuple[float, ...] = (10.0, 25.0, 100.0)
    rtt_ms: float = 40.0
    change: tuple[float, float] = (100.0, 2.0)
    rounds: int = 1  # each picture this many times a row
    protocol: str = "grpc"


def run_link(profile: DeviceProfile, model_dir: Path, settings: LinkSettings) -> dict[str, Any]:
    """The benchmark's report, run in a namespace of its own (see the module's docstring).

    Raises:
        EdgeError: not root, or ``unshare`` or ``tc`` missing or refused.
    """
    if os.environ.get(INSIDE) != "1":
        return _in_namespace()
    _loopback()
    repository = ModelRepository(model_dir)
    package = repository.get(MODEL)
    frames = _frames(package)
    sweep = quality_sweep(package, frames)
    with tempfile.TemporaryDirectory() as tmp, _served(model_dir, Path(tmp)) as gateway:
        rows = []
        measured = {}
        for rate in settings.rates_mbit:
            _shape(rate)
            measured[rate] = round(bulk_rate(rate_mbit=rate), 2)
            for label, hide, quality in (
                ("tensor", True, 90),
                ("encoded", False, 90),
                ("encoded q80 (tuned)", False, 80),
            ):
                rows.append(
                    _row(profile, repository, gateway, frames, settings, rate, label, hide, quality)
                )
        _match(rows, package)
        change = _change(profile, repository, gateway, frames, settings)
    return {
        "benchmark": "offload-link",
        "model": MODEL,
        "pictures": list(PICTURES),
        "settings": {
            "rates_mbit": list(settings.rates_mbit),
            "rtt_ms": settings.rtt_ms,
            "rtt_added": "at the transport seam (no netem in this kernel)",
            "rate_limited_by": "tc tbf on the loopback of a network namespace, MTU 1500",
            "measured_mbit": {f"{rate:g}": got for rate, got in measured.items()},
            "protocol": settings.protocol,
            "rounds": settings.rounds,
            "default_deadline_ms": DEFAULT_DEADLINE_MS,
            "policy": "shipped defaults (JPEG at quality 90, answers packed)",
        },
        "rows": rows,
        "qualities": sweep,
        "change": change,
        "machine": machine_info(),
    }


# -- the namespace and the link ------------------------------------------------------------


def _in_namespace() -> dict[str, Any]:
    """This command again under ``unshare -n``; its report."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("tc") is None:
        raise EdgeError("offload --link runs as root, with unshare and tc (util-linux, iproute2)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        argv = _without_json(sys.argv[1:])
        command = ["unshare", "-n", sys.executable, "-m", "benchmarks", *argv, "--json", str(out)]
        done = subprocess.run(command, env={**os.environ, INSIDE: "1"}, stdout=subprocess.DEVNULL)
        if done.returncode != 0 or not out.exists():
            raise EdgeError(f"the run in its network namespace failed (status {done.returncode})")
        report: dict[str, Any] = json.loads(out.read_text())
        return report


def _without_json(argv: Sequence[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--json":
            skip = True
        elif not arg.startswith("--json="):
            out.append(arg)
    return out


def _loopback() -> None:
    for command in (["ip", "link", "set", "lo", "up"], ["ip", "link", "set", "lo", "mtu", "1500"]):
        subprocess.run(command, check=True)


def _shape(rate_mbit: float) -> None:
    """The loopback's rate: a token bucket of two packets (a link that banks no credit
    while idle, as a larger bucket would: a 16 KB one let the answers after each pause
    go at once), packets waiting up to 2 s. What it gives is measured (:func:`bulk_rate`)."""
    subprocess.run(
        ["tc", "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", f"{rate_mbit}mbit",
         "burst", "4000", "latency", "2000ms"],
        check=True,
    )  # fmt: skip


def bulk_rate(seconds: float = 0.5, rate_mbit: float = 10.0) -> float:
    """The rate one bulk TCP transfer gets over the loopback now, in Mbit/s."""
    import socket
    import threading

    nbytes = int(rate_mbit * 1e6 / 8 * seconds)
    with socket.create_server(("127.0.0.1", 0)) as server:

        def drain() -> None:
            connection, _ = server.accept()
            with connection:
                while connection.recv(1 << 16):
                    pass

        reader = threading.Thread(target=drain)
        reader.start()
        started = time.perf_counter()
        with socket.create_connection(server.getsockname()) as client:
            client.sendall(bytes(nbytes))
            client.shutdown(socket.SHUT_WR)
            reader.join()
        return nbytes * 8 / (time.perf_counter() - started) / 1e6


@contextmanager
def _served(model_dir: Path, tmp: Path) -> Iterator[dict[str, Any]]:
    repository = tmp / "models"
    shutil.copytree(model_dir / MODEL, repository / MODEL)
    state = tmp / "state"
    state.mkdir()
    with gateway_process(repository, state) as gateway:
        yield gateway


class Delayed(Transport):
    """A transport whose exchanges take ``rtt_s`` more: half before, half after."""

    def __init__(self, inner: Transport, rtt_s: float, *, hide: bool) -> None:
        self.inner = inner
        self.name = inner.name
        self.half = rtt_s / 2
        self.hide = hide  # a gateway that lists none of the offload's extensions

    def _delayed(self, call: Any) -> Any:
        time.sleep(self.half)
        try:
            return call()
        finally:
            time.sleep(self.half)

    def infer(
        self, request: InferRequest, *, timeout: float, request_id: str = ""
    ) -> InferResponse:
        left = max(timeout - 2 * self.half, 0.001)
        answer: InferResponse = self._delayed(
            lambda: self.inner.infer(request, timeout=left, request_id=request_id)
        )
        return answer

    def model_metadata(self, name: str, *, timeout: float) -> dict[str, Any] | None:
        answer: dict[str, Any] | None = self._delayed(
            lambda: self.inner.model_metadata(name, timeout=timeout)
        )
        return answer

    def server_metadata(self, *, timeout: float) -> dict[str, Any] | None:
        answer: dict[str, Any] | None = self._delayed(
            lambda: self.inner.server_metadata(timeout=timeout)
        )
        if self.hide and answer is not None:
            answer = {**answer, "extensions": ["binary_tensor_data"]}
        return answer

    def repository_index(self, *, timeout: float) -> list[dict[str, Any]] | None:
        answer: list[dict[str, Any]] | None = self._delayed(
            lambda: self.inner.repository_index(timeout=timeout)
        )
        return answer

    def close(self) -> None:
        self.inner.close()


# -- the agent and its requests ------------------------------------------------------------


def _frames(package: Any) -> list[dict[str, np.ndarray]]:
    import cv2
    from skimage import data

    from edge_core.pictures import image_to_tensor

    frames = []
    for name in PICTURES:
        picture = getattr(data, name)()
        if picture.ndim == 2:
            picture = np.dstack([picture] * 3)
        picture = picture[:, :, :3]
        bgr = cv2.resize(cv2.cvtColor(picture, cv2.COLOR_RGB2BGR), (640, 480))
        frames.append({"x": image_to_tensor(bgr, package.preprocessing)})
    return frames


def _agent(
    profile: DeviceProfile,
    repository: ModelRepository,
    gateway: dict[str, Any],
    settings: LinkSettings,
    *,
    hide: bool,
    quality: int,
) -> Agent:
    from edge_agent.privacy.faces import open_detectors

    rules = replace(load_policy(DEFAULT_POLICY, device=profile.offload), picture_quality=quality)
    detector, checker = open_detectors(repository)
    inspector = PrivacyInspector(detector, checker=checker)
    address = gateway["grpc"] if settings.protocol == "grpc" else gateway["http"]
    inner = make_transport(settings.protocol, address, token=gateway["token"])
    offload = OffloadClient(
        Delayed(inner, settings.rtt_ms / 1000, hide=hide),
        guard=ExitGuard(inspector, rules, preprocessing=lambda m: repository.get(m).preprocessing),
        breaker=CircuitBreaker(),
    )
    return Agent(
        profile=profile,
        repository=repository,
        rules=rules,
        offload=offload,
        inspector=inspector,
        device_state=lambda: DeviceState(),
    )


def _row(
    profile: DeviceProfile,
    repository: ModelRepository,
    gateway: dict[str, Any],
    frames: list[dict[str, np.ndarray]],
    settings: LinkSettings,
    rate: float,
    label: str,
    hide: bool,
    quality: int,
) -> dict[str, Any]:
    """One row: the round trips with every answer let come, then the default deadline."""
    agent = _agent(profile, repository, gateway, settings, hide=hide, quality=quality)
    try:
        agent.warm(MODEL)
        agent.infer(MODEL, frames[0], deadline_ms=LONG_DEADLINE_MS)  # the link learnt
        latencies, up, down, answers = [], [], [], []
        for _ in range(settings.rounds):
            for frame in frames:
                result = agent.infer(MODEL, frame, deadline_ms=LONG_DEADLINE_MS)
                latencies.append(result.latency_ms)
                sent, received = result.wire_bytes or (0, 0)
                up.append(sent)
                down.append(received)
                answers.append(result.outputs)
        fates = {"cloud_in_time": 0, "missed": 0, "here_up_front": 0}
        said = ""
        for frame in frames:
            fate, message = _fate(agent, frame)
            fates[fate] += 1
            said = said or message
    finally:
        agent.close()
    return {
        "rate_mbit": rate,
        "form": label,
        "bytes_up": int(np.mean(up)),
        "bytes_down": int(np.mean(down)),
        "p50_ms": round(float(np.percentile(latencies, 50)), 1),
        "p90_ms": round(float(np.percentile(latencies, 90)), 1),
        "late": sum(1 for ms in latencies if ms > DEFAULT_DEADLINE_MS),  # past 1 s, had it been
        "at_default_deadline": fates,
        "decision": said,  # the first request's, at the default deadline
        "_answers": answers,
    }


def _fate(agent: Agent, frame: dict[str, np.ndarray]) -> tuple[str, str]:
    """What became of one request at the default deadline, and the decision's words:
    answered by the cloud in time; here up front, the link priced too slow (by the
    fallback's stand-in or cached answer, or refused at once); else missed."""
    try:
        result = agent.infer(MODEL, frame, deadline_ms=DEFAULT_DEADLINE_MS)
    except EdgeError as exc:
        decision = getattr(exc, "decision", None)
        if decision is not None and decision.reason == "deadline_remote_too_slow":
            return "here_up_front", decision.message
        return "missed", str(exc)
    message = result.decision.message
    if result.where == "cloud" and result.latency_ms <= DEFAULT_DEADLINE_MS:
        return "cloud_in_time", message
    if result.decision.reason == "deadline_remote_too_slow":
        return "here_up_front", message
    return "missed", message


def _match(rows: list[dict[str, Any]], package: Any) -> None:
    """Each row's answers against the tensor row's of its rate: the boxes' mean IoU."""
    from edge_agent.decoders import detections

    reference: dict[float, list[Any]] = {}
    for row in rows:
        boxes = [_boxes(detections(package, answer)) for answer in row.pop("_answers")]
        if row["form"] == "tensor":
            reference[row["rate_mbit"]] = boxes
        pairs = zip(reference[row["rate_mbit"]], boxes, strict=True)
        row["boxes_iou"] = round(float(np.mean([mean_iou(a, b) for a, b in pairs])), 4)


def _boxes(described: dict[str, Any] | None) -> np.ndarray:
    rows = (described or {}).get("detections") or [[]]
    return np.array([d["box"] for d in rows[0]], dtype=np.float64).reshape(-1, 4)


def mean_iou(reference: np.ndarray, found: np.ndarray) -> float:
    """Boxes matched one to one, best IoU first; what either side has unmatched counts
    0; the mean over the larger side (two empty sides agree: 1)."""
    if len(reference) == 0 and len(found) == 0:
        return 1.0
    if len(reference) == 0 or len(found) == 0:
        return 0.0
    x0 = np.maximum(reference[:, None, 0], found[None, :, 0])
    y0 = np.maximum(reference[:, None, 1], found[None, :, 1])
    x1 = np.minimum(reference[:, None, 2], found[None, :, 2])
    y1 = np.minimum(reference[:, None, 3], found[None, :, 3])
    inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
    iou = inter / (_area(reference)[:, None] + _area(found)[None, :] - inter + 1e-9)
    total, used_r, used_f = 0.0, set[int](), set[int]()
    for flat in np.argsort(-iou, axis=None):
        r, f = divmod(int(flat), iou.shape[1])
        if r in used_r or f in used_f or iou[r, f] <= 0:
            continue
        used_r.add(r)
        used_f.add(f)
        total += float(iou[r, f])
    return total / max(len(reference), len(found))


def quality_sweep(package: Any, frames: list[dict[str, np.ndarray]]) -> list[dict[str, Any]]:
    """The JPEG qualities against the tensor, with no link: each picture encoded as an
    offload encodes it, made the tensor again as the gateway makes it, run here; the
    boxes' mean IoU against the tensor's own (what a manifest's ``min_quality`` rests
    on), and the bytes."""
    from edge_agent.decoders import detections
    from edge_agent.offload.wire import encode_pictures
    from edge_core.pictures import pictures_to_tensor
    from edge_core.runtime import RuntimeOptions, open_best

    pre = package.preprocessing
    _, session = open_best(package, RuntimeOptions(warmup=1))
    output = package.outputs[0].name

    def boxes(tensor: np.ndarray) -> np.ndarray:
        return _boxes(detections(package, {output: session.run({"x": tensor})[output]}))

    reference = [boxes(frame["x"]) for frame in frames]
    sweep = []
    for quality in (95, 90, 80, 70, 60, 50):
        ious, sizes = [], []
        for frame, expected in zip(frames, reference, strict=True):
            request = InferRequest(inputs=frame, datatypes={"x": "FP32"})
            blob = encode_pictures(request, pre, "jpeg", quality).inputs["x"][0]
            tensor, _ = pictures_to_tensor([blob], pre, MODEL, max_pixels=10**8)
            ious.append(mean_iou(expected, boxes(tensor)))
            sizes.append(len(blob))
        sweep.append(
            {
                "quality": quality,
                "boxes_iou": round(float(np.mean(ious)), 4),
                "worst_iou": round(float(np.min(ious)), 4),
                "bytes": int(np.mean(sizes)),
            }
        )
    return sweep


def _area(boxes: np.ndarray) -> np.ndarray:
    area: np.ndarray = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return area


def _change(
    profile: DeviceProfile,
    repository: ModelRepository,
    gateway: dict[str, Any],
    frames: list[dict[str, np.ndarray]],
    settings: LinkSettings,
) -> dict[str, Any]:
    """The link's rate changes mid-run: the agent's estimate after each request."""
    before, after = settings.change
    _shape(before)
    agent = _agent(profile, repository, gateway, settings, hide=False, quality=90)
    estimates: list[dict[str, Any]] = []
    try:
        for index in range(14):
            if index == 6:
                _shape(after)
            result = agent.infer(MODEL, frames[index % len(frames)], deadline_ms=LONG_DEADLINE_MS)
            link = agent.offload.costs.link.estimate(0)  # type: ignore[union-attr]
            estimates.append(
                {
                    "request": index + 1,
                    "rate_mbit": before if index < 6 else after,
                    "estimate_mbit": None if link is None else link.bandwidth_mbit_s,
                    "latency_ms": round(result.latency_ms, 1),
                }
            )
    finally:
        agent.close()
    followed = next(
        (
            e["request"] - 6
            for e in estimates[6:]
            if e["estimate_mbit"] is not None and abs(e["estimate_mbit"] - after) <= 0.3 * after
        ),
        None,
    )
    return {"from_mbit": before, "to_mbit": after, "estimates": estimates, "followed_in": followed}


def format_link(report: dict[str, Any]) -> str:
    settings = report["settings"]
    lines = [
        f"Offload sized for the link: {report['model']}, {len(report['pictures'])} pictures "
        f"640x480, {settings['protocol']}, round trip {settings['rtt_ms']:.0f} ms "
        f"({settings['rtt_added']}), rate by {settings['rate_limited_by']}; "
        f"{settings['policy']}",
        "",
    ]
    headers = ["Mbit/s", "form", "bytes up", "bytes down", "p50 ms", "p90 ms", "over 1 s",
               "boxes IoU", "in time", "missed", "here first"]  # fmt: skip
    rows = [
        [
            r["rate_mbit"], r["form"], r["bytes_up"], r["bytes_down"], r["p50_ms"], r["p90_ms"],
            f"{r['late']}/{len(report['pictures']) * report['settings'].get('rounds', 1)}",
            r["boxes_iou"], *r["at_default_deadline"].values(),
        ]
        for r in report["rows"]
    ]  # fmt: skip
    lines.append(render_table(headers, rows))
    lines.append(
        "(over 1 s: round trips longer than the default deadline, every answer let come; "
        "then at that deadline: answered by the cloud in time, missed, or answered here "
        "up front, the link's estimate saying the cloud would miss it)"
    )
    measured = settings.get("measured_mbit", {})
    lines.append(
        "one bulk transfer got: "
        + ", ".join(f"{got:g} Mbit/s at {rate}" for rate, got in measured.items())
    )
    lines += [
        "",
        "JPEG quality against the tensor, no link (the boxes' IoU, mean and worst picture):",
        render_table(
            ["quality", "bytes", "boxes IoU", "worst"],
            [
                [q["quality"], q["bytes"], q["boxes_iou"], q["worst_iou"]]
                for q in report["qualities"]
            ],
        ),
    ]
    change = report["change"]
    lines += [
        "",
        f"The link changes {change['from_mbit']:g} -> {change['to_mbit']:g} Mbit/s after "
        f"request 6; the estimate within 30% after {change['followed_in']} request(s):",
        render_table(
            ["request", "Mbit/s", "estimate", "ms"],
            [
                [e["request"], e["rate_mbit"], e["estimate_mbit"], e["latency_ms"]]
                for e in change["estimates"]
            ],
        ),
    ]
    return "\n".join(lines)
