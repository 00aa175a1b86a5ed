"""Model packages built for a test: a valid ONNX model of a given size (its weight
table is that big), with golden data, for updates that span several chunks."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from edge_core.package import ModelPackage, Tolerance, Variant
from edge_core.tensors import TensorSpec

__all__ = ["sized_package"]


def sized_package(folder: Path, megabytes: int) -> Path:
    """A package of ``megabytes`` MB in ``folder``: ``y = x + 0 * table[0]``; its model file."""
    table = np.random.default_rng(megabytes).random(megabytes << 18, dtype=np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "first"], ["t"]),
        helper.make_node("Mul", ["t", "zero"], ["z"]),
        helper.make_node("Add", ["x", "z"], ["y"]),
    ]
    weights = [
        numpy_helper.from_array(table, "table"),
        numpy_helper.from_array(np.int64(0), "first"),
        numpy_helper.from_array(np.float32(0), "zero"),
    ]
    spec = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 4]) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "sized", spec[:1], spec[1:], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    data = model.SerializeToString()
    folder.mkdir(parents=True)
    file = folder / "model.fp32.onnx"
    file.write_bytes(data)
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.savez(folder / "golden.npz", **{"input:x": x, "output:y": x})
    variant = Variant(
        "onnx-fp32", "onnx", "fp32", file.name, hashlib.sha256(data).hexdigest(), len(data),
        tolerance=Tolerance(1e-5, 0.0),
    )  # fmt: skip
    ModelPackage(
        root=folder,
        name="big",
        version=1,
        task="other",
        inputs=(TensorSpec("x", "FP32", (-1, 4)),),
        outputs=(TensorSpec("y", "FP32", (-1, 4)),),
        variants=(variant,),
        golden_file="golden.npz",
    ).write_manifest()
    return file
