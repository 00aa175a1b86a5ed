"""MLServer 1.7.1 as a peer and as a third-party engine behind the gateway.

MLServer goes into a virtual environment of its own (:mod:`benchmarks.peers.envs`,
``<cache>/mlserver-1.7.1``): installed from the package registry on first use (about
a minute), then reused. Its model is one of ours: a small custom MLServer runtime
(:data:`RUNTIME`, written beside the model's settings) that runs an ONNX variant with
ONNX Runtime, declaring the inputs and outputs from the package's manifest so that
the model's metadata says what it takes. With ``max_batch_size`` above 1 MLServer's
adaptive batching groups concurrent requests (it waits up to ``max_batch_time`` for
a fuller batch: at 0 it would not batch at all). MLServer has no binary tensor
extension over HTTP: its clients send JSON tensors.

``python tools/mlserver_engine.py`` starts it in the foreground; :func:`start` does
the same from Python and returns once the model is ready.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.peers.envs import ensure_env, wait_ready

__all__ = ["ENV_NAME", "MLSERVER_VERSION", "RUNTIME", "ensure", "model_dir", "start"]

MLSERVER_VERSION = "1.7.1"
ENV_NAME = f"mlserver-{MLSERVER_VERSION}"

RUNTIME = '''"""An MLServer runtime that runs one ONNX model with ONNX Runtime."""

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class OnnxModel(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        extra = self._settings.parameters.extra or {}
        options.intra_op_num_threads = int(extra.get("threads", 1))
        uri = await get_model_uri(self._settings)
        self._session = ort.InferenceSession(uri, options, providers=["CPUExecutionProvider"])
        self._outputs = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feed = {i.name: NumpyCodec.decode_input(i).astype(np.float32) for i in payload.inputs}
        results = self._session.run(self._outputs, feed)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            id=payload.id,
            outputs=[NumpyCodec.encode_output(n, r) for n, r in zip(self._outputs, results)],
        )
'''


def ensure() -> Path:
    """The ``mlserver`` command of the cached environment, made when missing.

    Raises:
        PeerUnavailable: it cannot be installed here.
    """
    env = ensure_env(ENV_NAME, [f"mlserver=={MLSERVER_VERSION}", "onnxruntime"])
    return env / "bin" / "mlserver"


def model_dir(
    folder: Path,
    package_dir: Path,
    variant: str = "onnx-fp32",
    *,
    threads: int = 1,
    max_batch_size: int = 0,
    max_batch_time: float = 0.0,
) -> Path:
    """An MLServer model repository in ``folder`` with one model: ``package_dir``'s
    ``variant``, its inputs and outputs declared from the manifest; adaptive batching
    up to ``max_batch_size`` requests (0: off) waiting at most ``max_batch_time`` s."""
    manifest = json.loads((package_dir / "manifest.json").read_text())
    chosen = next(v for v in manifest["variants"] if v["id"] == variant)
    target = folder / manifest["name"]
    target.mkdir(parents=True, exist_ok=True)
    (target / "onnx_runtime.py").write_text(RUNTIME)

    def tensors(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"name": t["name"], "datatype": t["datatype"], "shape": t["shape"]} for t in items]

    settings: dict[str, Any] = {
        "name": manifest["name"],
        "implementation": "onnx_runtime.OnnxModel",
        "inputs": tensors(manifest["inputs"]),
        "outputs": tensors(manifest["outputs"]),
        "parameters": {"uri": str(package_dir / chosen["file"]), "extra": {"threads": threads}},
    }
    if max_batch_size > 1:
        settings["max_batch_size"] = max_batch_size
        settings["max_batch_time"] = max_batch_time
    (target / "model-settings.json").write_text(json.dumps(settings, indent=2))
    return folder


def start(
    folder: Path,
    http_port: int,
    grpc_port: int,
    *,
    log: Path | None = None,
    cpus: set[int] | frozenset[int] | None = None,
    timeout: float = 120.0,
) -> subprocess.Popen[bytes]:
    """MLServer on ``folder`` (from :func:`model_dir`), ready when this returns.

    One process: no parallel inference workers (they would fork a pool per model on
    a machine of two cores) and no metrics server (a port of its own).

    Raises:
        PeerUnavailable: it cannot be installed, it exited, or it was not ready
            within ``timeout``.
    """
    mlserver = ensure()
    (folder / "settings.json").write_text(
        json.dumps(
            {
                "host": "127.0.0.1",
                "http_port": http_port,
                "grpc_port": grpc_port,
                "parallel_workers": 0,
                "metrics_endpoint": None,
                "debug": False,
                # its GZip middleware compresses answers for clients that accept gzip
                # (aiohttp's default), and the stock tritonclient.http.aio cannot read
                # them: off, as for any small-answer service
                "gzip_enabled": False,
            }
        )
    )
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    process = subprocess.Popen(
        [str(mlserver), "start", str(folder)],
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=folder,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )
    names = [p.name for p in folder.iterdir() if (p / "model-settings.json").is_file()]
    paths = [f"/v2/models/{name}/ready" for name in names]
    wait_ready(process, http_port, paths, what="mlserver", log=log, timeout=timeout)
    return process
