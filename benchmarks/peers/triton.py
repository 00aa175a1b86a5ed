"""NVIDIA Triton Inference Server, through PyTriton 0.7.0, as a peer.

PyTriton ships Triton's server binary in its wheel and runs it as a child process:
Triton's C++ HTTP and gRPC front ends and its dynamic batcher, the model in Triton's
Python backend, whose stub hands each batch over shared memory to the Python
process that bound it, where our callable (:data:`SERVER`) runs the package's ONNX
variant with ONNX Runtime. That is how a Python team serves a model with Triton.

PyTriton 0.7.0 works under Debian's ``/usr/bin/python3`` (3.11.2); under another
3.11 build (this machine's default 3.11.7) Triton's Python backend stub fails
(``RLock._recursion_count``). Its environment is therefore made with
:data:`PYTHON` (:mod:`benchmarks.peers.envs`, ``<cache>/pytriton-0.7.0``, about
450 MB), and :class:`~benchmarks.peers.PeerUnavailable` says so when it is
missing. Triton listens on loopback only.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from benchmarks.peers.envs import ensure_env, wait_ready
from edge_core.processes import free_port

__all__ = ["ENV_NAME", "PYTHON", "PYTRITON_VERSION", "SERVER", "ensure", "start"]

PYTRITON_VERSION = "0.7.0"
ENV_NAME = f"pytriton-{PYTRITON_VERSION}"
PYTHON = "/usr/bin/python3"

SERVER = '''"""Triton (PyTriton) serving one ONNX model with ONNX Runtime in its Python backend."""

import json
import signal
import sys

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

settings = json.load(open(sys.argv[1]))
options = ort.SessionOptions()
options.intra_op_num_threads = settings["threads"]
session = ort.InferenceSession(settings["model"], options, providers=["CPUExecutionProvider"])
outputs = [t["name"] for t in settings["outputs"]]
DTYPES = {"FP32": np.float32, "FP16": np.float16, "INT64": np.int64, "INT32": np.int32,
          "INT8": np.int8, "UINT8": np.uint8, "FP64": np.float64, "BOOL": np.bool_}


@batch
def infer(**inputs):
    return dict(zip(outputs, session.run(outputs, inputs)))


def tensors(items):
    return [Tensor(name=t["name"], dtype=DTYPES[t["datatype"]], shape=tuple(t["shape"][1:]))
            for t in items]


config = TritonConfig(
    http_address="127.0.0.1", http_port=settings["http_port"],
    grpc_address="127.0.0.1", grpc_port=settings["grpc_port"],
    metrics_address="127.0.0.1", metrics_port=settings["metrics_port"],
)


def stop(*_):
    raise KeyboardInterrupt  # out of serve(): Triton and its stub stop with the context


signal.signal(signal.SIGTERM, stop)
with Triton(config=config) as triton:
    triton.bind(
        model_name=settings["name"],
        infer_func=infer,
        inputs=tensors(settings["inputs"]),
        outputs=tensors(settings["outputs"]),
        config=ModelConfig(
            max_batch_size=settings["max_batch_size"],
            batcher=DynamicBatcher(max_queue_delay_microseconds=settings["delay_us"]),
        ),
    )
    print("ready", flush=True)
    try:
        triton.serve()
    except KeyboardInterrupt:
        pass
'''


def ensure() -> Path:
    """The Python of the cached PyTriton environment, made when missing.

    Raises:
        PeerUnavailable: Debian's Python is missing, or PyTriton cannot be installed.
    """
    env = ensure_env(
        ENV_NAME, [f"nvidia-pytriton=={PYTRITON_VERSION}", "onnxruntime"], python=PYTHON
    )
    return env / "bin" / "python"


def start(
    folder: Path,
    package_dir: Path,
    http_port: int,
    grpc_port: int,
    *,
    variant: str = "onnx-fp32",
    threads: int = 1,
    max_batch_size: int = 64,
    delay_us: int = 0,
    log: Path | None = None,
    cpus: set[int] | frozenset[int] | None = None,
    timeout: float = 180.0,
) -> subprocess.Popen[bytes]:
    """Triton serving ``package_dir``'s ``variant`` with its dynamic batcher (up to
    ``max_batch_size`` rows, waiting at most ``delay_us``), ready when this returns.
    ``folder`` holds the server's script and settings.

    Raises:
        PeerUnavailable: it cannot be installed, it exited, or it was not ready
            within ``timeout``.
    """
    python = ensure()
    manifest = json.loads((package_dir / "manifest.json").read_text())
    chosen = next(v for v in manifest["variants"] if v["id"] == variant)
    folder.mkdir(parents=True, exist_ok=True)
    script, settings = folder / "triton_server.py", folder / "triton.json"
    script.write_text(SERVER)
    settings.write_text(
        json.dumps(
            {
                "name": manifest["name"],
                "model": str(package_dir / chosen["file"]),
                "inputs": manifest["inputs"],
                "outputs": manifest["outputs"],
                "threads": threads,
                "max_batch_size": max_batch_size,
                "delay_us": delay_us,
                "http_port": http_port,
                "grpc_port": grpc_port,
                "metrics_port": free_port(),
            }
        )
    )
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    process = subprocess.Popen(
        [str(python), str(script), str(settings)],
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=folder,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )
    paths = [f"/v2/models/{manifest['name']}/ready"]
    wait_ready(process, http_port, paths, what="triton", log=log, timeout=timeout)
    return process
