"""MLServer 1.7.1 serving one of our model packages, in the foreground.

    python tools/mlserver_engine.py --model digits-heavy --http-port 8080 --grpc-port 8081

MLServer runs from its own cached virtual environment (made on first use, never the
project's), with a small custom runtime that runs the package's ONNX variant with
ONNX Runtime: :mod:`benchmarks.peers.mlserver`, which the tests and
``python -m benchmarks peers`` use too. Ctrl-C or SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from benchmarks.peers.envs import CACHE
from benchmarks.peers.mlserver import MLSERVER_VERSION, RUNTIME, ensure, model_dir, start

__all__ = ["MLSERVER_VERSION", "RUNTIME", "ensure", "main", "model_dir", "start"]

ROOT = Path(__file__).resolve().parent.parent


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
