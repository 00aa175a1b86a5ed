"""MLServer 1.7.1 as a third-party Open Inference Protocol engine, for the tests and
the remote-backend benchmark.

MLServer goes into a virtual environment of its own, never into the project's
(its pins of FastAPI, pydantic and protobuf are its own business), cached
under ``~/.cache/edge-inference/mlserver-1.7.1``: installed from PyPI on first
use (about a minute), then reused. Its model is one of ours: a small custom
MLServer runtime (:data:`RUNTIME`, written beside the model's settings) that
runs an ONNX variant with ONNX Runtime, declaring the inputs and outputs from
the package's manifest so that the model's metadata says what it takes.

    python tools/mlserver_engine.py --model digits-heavy --http-port 8080 --grpc-port 8081

starts it in the foreground (Ctrl-C stops it); :func:`start` does the same from
Python and returns once the model is ready.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["MLSERVER_VERSION", "RUNTIME", "ensure_env", "model_dir", "start"]

MLSERVER_VERSION = "1.7.1"
ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edge-inference"

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


def ensure_env(base_python: str | None = None) -> Path:
    """The ``mlserver`` command of the cached environment, made when missing.

    Several processes may ask at once (test workers): one installs, the others wait
    on the lock. A half-made environment (no marker) is made again.
    """
    env = CACHE / f"mlserver-{MLSERVER_VERSION}"
    mlserver = env / "bin" / "mlserver"
    marker = env / ".installed"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"mlserver-{MLSERVER_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.is_file():
            python = str(base_python or getattr(sys, "_base_executable", sys.executable))
            subprocess.run([python, "-m", "venv", "--clear", str(env)], check=True)
            subprocess.run(
                [
                    str(env / "bin" / "python"),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    f"mlserver=={MLSERVER_VERSION}",
                    "onnxruntime",
                ],
                check=True,
            )
            marker.write_text(f"mlserver=={MLSERVER_VERSION}\n")
    return mlserver


def model_dir(
    folder: Path, package_dir: Path, variant: str = "onnx-fp32", *, threads: int = 1
) -> Path:
    """An MLServer model repository in ``folder`` with one model: ``package_dir``'s
    ``variant``, its inputs and outputs declared from the manifest."""
    manifest = json.loads((package_dir / "manifest.json").read_text())
    chosen = next(v for v in manifest["variants"] if v["id"] == variant)
    target = folder / manifest["name"]
    target.mkdir(parents=True, exist_ok=True)
    (target / "onnx_runtime.py").write_text(RUNTIME)

    def tensors(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"name": t["name"], "datatype": t["datatype"], "shape": t["shape"]} for t in items]

    settings = {
        "name": manifest["name"],
        "implementation": "onnx_runtime.OnnxModel",
        "inputs": tensors(manifest["inputs"]),
        "outputs": tensors(manifest["outputs"]),
        "parameters": {"uri": str(package_dir / chosen["file"]), "extra": {"threads": threads}},
    }
    (target / "model-settings.json").write_text(json.dumps(settings, indent=2))
    return folder


def start(
    folder: Path,
    http_port: int,
    grpc_port: int,
    *,
    log: Path | None = None,
    cpus: set[int] | None = None,
    timeout: float = 120.0,
) -> subprocess.Popen[bytes]:
    """MLServer on ``folder`` (from :func:`model_dir`), ready when this returns.

    One process: no parallel inference workers (they would fork a pool per model on
    a machine of two cores) and no metrics server (a port of its own).

    Raises:
        RuntimeError: it exited, or was not ready within ``timeout``.
    """
    mlserver = ensure_env()
    (folder / "settings.json").write_text(
        json.dumps(
            {
                "host": "127.0.0.1",
                "http_port": http_port,
                "grpc_port": grpc_port,
                "parallel_workers": 0,
                "metrics_endpoint": None,
                "debug": False,
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
    end = time.monotonic() + timeout
    names = [p.name for p in folder.iterdir() if (p / "model-settings.json").is_file()]
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"mlserver exited with {process.returncode} (log: {log})")
        try:
            for name in names:
                url = f"http://127.0.0.1:{http_port}/v2/models/{name}/ready"
                with urllib.request.urlopen(url, timeout=1) as answer:
                    answer.read()
            return process
        except OSError:
            if time.monotonic() > end:
                process.kill()
                raise RuntimeError(
                    f"mlserver was not ready within {timeout} s (log: {log})"
                ) from None
            time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="digits-heavy")
    parser.add_argument("--variant", default="onnx-fp32")
    parser.add_argument("--http-port", type=int, default=8080)
    parser.add_argument("--grpc-port", type=int, default=8081)
    parser.add_argument("--dir", type=Path, default=CACHE / "mlserver-models")
    args = parser.parse_args(argv)
    folder = model_dir(args.dir, ROOT / "models" / args.model / "1", args.variant)
    process = start(folder, args.http_port, args.grpc_port)
    print(f"mlserver ready: http://127.0.0.1:{args.http_port}, grpc://127.0.0.1:{args.grpc_port}")
    import signal

    # SIGTERM (a service manager, a script's kill) stops MLServer too, as Ctrl-C does
    signal.signal(signal.SIGTERM, lambda *_: process.terminate())
    try:
        process.wait()
    except KeyboardInterrupt:
        process.terminate()
        process.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
