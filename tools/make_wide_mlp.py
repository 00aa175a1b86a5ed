"""Write ``wide-mlp``, a model package where dynamic batching pays, for the benchmarks.

    python tools/make_wide_mlp.py --out models     # models/wide-mlp/1 (ignored by git)

digits-heavy, the cloud's sample model, is a CNN whose per-item cost hardly falls
with the batch size on a CPU: batching it saves only the hand-offs. A wide MLP is
the other kind: at batch 1 each of its matrix products reads every weight once for
one row (memory-bound), at batch 64 the same read serves 64 rows, so its per-item
cost falls about tenfold (measured on this machine's x86 cores: ~1 ms at batch 1,
~0.07 ms an item at batch 64). It takes the digits' 64 features and answers ten
probabilities, the digits models' input and output, so that every client and peer
of the benchmarks sends it the same request.

Its weights are random (He initialization, a fixed seed) and it is not trained: it
is a compute model, with no accuracy to report. The package is made here, from
nothing but NumPy and ``onnx.helper``, in a second; at 8.7 MB it is not committed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["NAME", "build_onnx", "write_package"]

NAME = "wide-mlp"
INPUT = "pixels"
OUTPUT = "probabilities"
FEATURES = 64
CLASSES = 10
WIDTH = 1024
DEPTH = 3  # hidden layers
SEED = 0
ONNX_OPSET = 17
GOLDEN_ROWS = 4

Array = np.ndarray[Any, Any]


def build_onnx(width: int = WIDTH, depth: int = DEPTH, seed: int = SEED) -> bytes:
    """The FP32 ONNX graph: ``depth`` Gemm + Relu layers of ``width``, then Gemm + Softmax,
    with a dynamic batch dimension."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, weights = [], []
    x, size = INPUT, FEATURES
    for layer in range(depth + 1):
        last = layer == depth
        out = CLASSES if last else width
        w = (rng.standard_normal((size, out)) * np.sqrt(2.0 / size)).astype(np.float32)
        weights += [
            numpy_helper.from_array(w, f"w{layer}"),
            numpy_helper.from_array(np.zeros(out, np.float32), f"b{layer}"),
        ]
        y = "logits" if last else f"h{layer}"
        nodes.append(helper.make_node("Gemm", [x, f"w{layer}", f"b{layer}"], [y]))
        if last:
            nodes.append(helper.make_node("Softmax", [y], [OUTPUT], axis=1))
        else:
            nodes.append(helper.make_node("Relu", [y], [f"r{layer}"]))
            x, size = f"r{layer}", out
    graph = helper.make_graph(
        nodes,
        NAME,
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["batch", FEATURES])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", CLASSES])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    model.ir_version = 8  # what every ONNX Runtime since 1.10 reads
    data: bytes = model.SerializeToString()
    return data


def _run(onnx_bytes: bytes, x: Array) -> Array:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])
    result: Array = session.run([OUTPUT], {INPUT: x})[0]
    return result


def write_package(out: Path, *, width: int = WIDTH, depth: int = DEPTH) -> Path:
    """Write ``out/wide-mlp/1`` (manifest, FP32 ONNX, golden data); its folder."""
    root = out / NAME / "1"
    root.mkdir(parents=True, exist_ok=True)
    onnx_bytes = build_onnx(width, depth)
    (root / "model.fp32.onnx").write_bytes(onnx_bytes)
    x = np.random.default_rng(SEED + 1).uniform(0.0, 16.0, (GOLDEN_ROWS, FEATURES))
    x = x.astype(np.float32)
    golden: dict[str, Any] = {f"input:{INPUT}": x, f"output:{OUTPUT}": _run(onnx_bytes, x)}
    np.savez(root / "golden.npz", **golden)
    manifest = {
        "name": NAME,
        "version": 1,
        "task": "classification",
        "description": (
            f"A wide MLP ({FEATURES} -> {depth} x {width} -> {CLASSES}, random weights, "
            "untrained) whose per-item cost falls about tenfold from batch 1 to 64: the "
            "benchmarks' model where dynamic batching pays."
        ),
        "inputs": [{"name": INPUT, "datatype": "FP32", "shape": [-1, FEATURES]}],
        "outputs": [{"name": OUTPUT, "datatype": "FP32", "shape": [-1, CLASSES]}],
        "variants": [
            {
                "id": "onnx-fp32",
                "format": "onnx",
                "precision": "fp32",
                "file": "model.fp32.onnx",
                "sha256": hashlib.sha256(onnx_bytes).hexdigest(),
                "size": len(onnx_bytes),
                "tolerance": {"atol": 1e-5, "rtol": 1e-4},
            }
        ],
        "golden": {"file": "golden.npz"},
        "source": "tools/make_wide_mlp.py (random weights, seed 0)",
        "license": "Apache-2.0",
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "models")
    parser.add_argument("--width", type=int, default=WIDTH)
    parser.add_argument("--depth", type=int, default=DEPTH)
    args = parser.parse_args(argv)
    root = write_package(args.out, width=args.width, depth=args.depth)
    print(f"wrote {root}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
