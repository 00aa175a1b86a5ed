"""``python -m benchmarks ota``: publish and install large models over loopback.

For each size (50 and 200 MB by default) a model with random weights is
packaged, encrypted and signed (``cloud-gateway models publish``), served by a
gateway in a child process, and installed by a fresh device process that
times each phase and reads its peak memory:

- install throughput: download + hash check + tag check + write to the slot,
  in MB/s (target >= 400);
- the install path's peak RSS increase: over the download and the checks, and
  over the write into the slot (the smoke test between them loads the model
  whole into a runtime, as it may; it is timed apart, and the peak is reset
  after it through ``/proc/self/clear_refs``): it must not grow with the
  model's size.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from edge_core.processes import free_port, stop_process
from edge_core.report import machine_info, render_table

__all__ = ["format_ota", "run_ota"]

TARGET_MB_S = 400.0


def _vm(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1]) / 1024.0
    return 0.0


def big_model_package(folder: Path, megabytes: int) -> Path:
    """A valid ONNX package of about ``megabytes`` MB: a random table the graph reduces."""
    try:
        from onnx import TensorProto, helper, numpy_helper
    except ImportError as exc:  # the dev extra has it
        raise SystemExit("the OTA benchmark builds its models with `onnx` (the dev extra)") from exc

    from edge_core.package import ModelPackage, Tolerance, Variant
    from edge_core.tensors import TensorSpec

    folder.mkdir(parents=True)
    table = np.random.default_rng(megabytes).standard_normal(megabytes * 262144).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMax", ["table"], ["m"], keepdims=0),
            helper.make_node("Mul", ["m", "zero"], ["z"]),
            helper.make_node("Add", ["x", "z"], ["y"]),
        ],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.float32(0), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    data = model.SerializeToString()
    (folder / "model.fp32.onnx").write_bytes(data)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    golden: dict[str, Any] = {"input:x": x, "output:y": x}
    np.savez(folder / "golden.npz", **golden)
    ModelPackage(
        root=folder,
        name="big",
        version=1,
        task="other",
        inputs=(TensorSpec("x", "FP32", (-1, 4)),),
        outputs=(TensorSpec("y", "FP32", (-1, 4)),),
        variants=(
            Variant(
                "onnx-fp32",
                "onnx",
                "fp32",
                "model.fp32.onnx",
                hashlib.sha256(data).hexdigest(),
                len(data),
                tolerance=Tolerance(1e-5, 0.0),
            ),
        ),
        golden_file="golden.npz",
    ).write_manifest()
    return folder / "model.fp32.onnx"


def _install(bundle: str, state: str, url: str) -> dict[str, Any]:
    """In a fresh process: one update check, with a clock and a memory reading per phase."""
    from edge_agent.config import OtaSettings
    from edge_agent.ota import OtaUpdater, load_bundle
    from edge_agent.profiles import ProfileStore
    from edge_core.paths import default_profiles_dir

    marks: dict[str, float] = {}
    memory: dict[str, float] = {}

    timed = ("key", "downloaded", "hash-verified", "tags-verified", "slot-written", "smoke-tested")

    def on_step(step: str) -> None:
        if step in timed:
            marks[step] = time.perf_counter()
            memory[step] = _vm("VmHWM")
        if step == "smoke-tested":
            # The smoke test held the model whole (allowed); start the peak again from
            # here so that the write into the slot is measured on its own.
            memory["write-start"] = _vm("VmRSS")
            Path("/proc/self/clear_refs").write_text("5")

    profile = ProfileStore(default_profiles_dir()).get("generic-x86_64")
    settings = OtaSettings(state_dir=Path(state), url=url)
    updater = OtaUpdater(settings, load_bundle(Path(bundle)), profile, on_step=on_step)
    outcomes = updater.check()
    updater.close()
    return {"outcomes": [o.to_dict() for o in outcomes], "marks": marks, "memory": memory}


def run_ota(sizes: tuple[int, ...] = (50, 200)) -> dict[str, Any]:
    report: dict[str, Any] = {"benchmark": "ota", "machine": machine_info(), "sizes": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        gateway = [sys.executable, "-m", "cloud_gateway", "--state-dir", str(root / "state")]
        keys, ota = root / "keys", root / "ota"
        quiet = {"check": True, "capture_output": True}
        subprocess.run([*gateway, "keys", "init", "--dir", str(keys)], **quiet)  # type: ignore[call-overload]
        http_port = free_port()
        config = root / "gateway.toml"
        config.write_text(
            f'repository = "{root / "served"}"\nstate_dir = "{root / "state"}"\n'
            f'ota_repository = "{ota}"\nhttp_port = {http_port}\ngrpc_port = {free_port()}\n'
        )
        (root / "served").mkdir()
        # the first device of the group makes the group's key, which publishing needs
        subprocess.run([*gateway, "device", "add", "bench-0", "--group", "bench"], **quiet)  # type: ignore[call-overload]
        for index, size in enumerate(sizes):
            model = big_model_package(root / f"big-{size}" / "1", size)
            publish = [*gateway, "models", "publish", "--repository", str(ota), "--keys", str(keys)]
            publish += ["--name", "big", "--version", str(index + 1), "--file", str(model)]
            subprocess.run([*publish, "--group", "bench"], **quiet)  # type: ignore[call-overload]
            model.unlink()
        process = subprocess.Popen(
            [sys.executable, "-m", "cloud_gateway", "--config", str(config), "serve"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            _wait_ready(http_port)
            for index, size in enumerate(sizes):
                version = index + 1
                device = f"bench-{size}"
                bundle = root / f"{device}.json"
                add = [*gateway, "device", "add", device, "--group", "bench"]
                add += ["--repository", str(ota), "--bundle", str(bundle)]
                subprocess.run(add, **quiet)  # type: ignore[call-overload]
                subprocess.run(
                    [*gateway, "rollout", "start", "--name", "big", "--version", str(version),
                     "--group", "bench", "--percent", "100"],
                    check=True, capture_output=True,
                )  # fmt: skip
                context = multiprocessing.get_context("spawn")
                with context.Pool(1) as pool:
                    result = pool.apply(
                        _install, (str(bundle), str(root / device), f"http://127.0.0.1:{http_port}")
                    )
                report["sizes"].append(_summarise(size, version, result))
                subprocess.run(
                    [*gateway, "rollout", "abort", "--name", "big", "--version", str(version)],
                    check=True, capture_output=True,
                )  # fmt: skip
        finally:
            stop_process(process)
    growth = [s["install_peak_rss_increase_mb"] for s in report["sizes"]]
    report["summary"] = {
        "min_install_mb_s": min(s["install_mb_s"] for s in report["sizes"]),
        "meets_throughput_target": all(s["install_mb_s"] >= TARGET_MB_S for s in report["sizes"]),
        "rss_increase_spread_mb": round(max(growth) - min(growth), 1),
    }
    return report


def _wait_ready(port: int) -> None:
    import urllib.request

    end = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1):
                return
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def _summarise(size: int, version: int, result: dict[str, Any]) -> dict[str, Any]:
    outcome = next(o for o in result["outcomes"] if o["name"] == "big")
    if outcome["status"] != "installed" or outcome["version"] != version:
        raise RuntimeError(f"the install failed: {json.dumps(outcome)}")
    marks, memory = result["marks"], result["memory"]
    # the install path: download, hash, tags, and the write into the slot; the smoke
    # test (between the tags and the write: it decrypts the model into memory) is
    # measured apart
    smoke = marks["smoke-tested"] - marks["tags-verified"]
    write = marks["slot-written"] - marks["smoke-tested"]
    total = marks["tags-verified"] - marks["key"] + write
    blob_mb = size * 1.0

    def rate(start: str, end: str) -> float:
        return round(blob_mb / max(float(marks[end]) - float(marks[start]), 1e-9), 1)

    return {
        "model_mb": size,
        "download_and_hash_mb_s": rate("key", "downloaded"),
        "tag_check_mb_s": rate("hash-verified", "tags-verified"),
        "write_s": round(write, 3),
        "install_s": round(total, 3),
        "install_mb_s": round(blob_mb / total, 1),
        "install_peak_rss_increase_mb": round(
            max(
                memory["tags-verified"] - memory["key"],
                memory["slot-written"] - memory["write-start"],
            ),
            1,
        ),
        "write_peak_rss_increase_mb": round(memory["slot-written"] - memory["write-start"], 1),
        "smoke_test_s": round(smoke, 3),
    }


def format_ota(report: dict[str, Any]) -> str:
    rows = [
        [s["model_mb"], s["download_and_hash_mb_s"], s["tag_check_mb_s"], s["write_s"],
         s["install_mb_s"], s["install_peak_rss_increase_mb"],
         s["write_peak_rss_increase_mb"], s["smoke_test_s"]]
        for s in report["sizes"]
    ]  # fmt: skip
    summary = report["summary"]
    return "\n".join(
        [
            "OTA install on loopback (download + SHA-256 + GCM tags + write to the slot)",
            render_table(
                [
                    "model MB",
                    "download+hash MB/s",
                    "tags MB/s",
                    "write s",
                    "install MB/s",
                    "peak RSS +MB",
                    "write +MB",
                    "smoke test s",
                ],
                rows,
            ),
            f"slowest install {summary['min_install_mb_s']:.0f} MB/s "
            f"(target >= {TARGET_MB_S:.0f}); the peak RSS increase differs by "
            f"{summary['rss_increase_spread_mb']} MB between sizes",
        ]
    )
