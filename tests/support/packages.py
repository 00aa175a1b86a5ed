"""Model packages built for a test: a valid ONNX model of a given size (its weight
table is that big), with golden data, for updates that span several chunks; and
package archives with a member that inflates when it is read."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from edge_core.package import ModelPackage, Tolerance, Variant
from edge_core.repository import ModelRepository
from edge_core.runtime import RuntimeOptions
from edge_core.tensors import TensorSpec

from .paths import MODELS

__all__ = ["blind_centerface", "sized_package", "with_sparse_member"]


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


def blind_centerface(source: Path, folder: Path, version: int = 2) -> Path:
    """A CenterFace package (``source``: the shipped one's folder) whose heatmap is all
    zeros: a detector that finds no face, so that a test can tell whether the privacy
    checks run it. Valid in every other way (its golden data its own); its ONNX file."""
    import json

    import onnx
    import onnxruntime as ort

    model = onnx.load(str(source / "model.fp32.onnx"))
    heat = model.graph.output[0].name
    for node in model.graph.node:
        node.output[:] = [f"{heat}_seen" if out == heat else out for out in node.output]
    model.graph.initializer.append(numpy_helper.from_array(np.float32(0), "blind"))
    model.graph.node.append(helper.make_node("Mul", [f"{heat}_seen", "blind"], [heat]))
    data = model.SerializeToString()
    folder.mkdir(parents=True)
    file = folder / "model.fp32.onnx"
    file.write_bytes(data)
    manifest = json.loads((source / "manifest.json").read_text())
    golden = dict(np.load(source / "golden.npz"))
    inputs = {k.removeprefix("input:"): v for k, v in golden.items() if k.startswith("input:")}
    session = ort.InferenceSession(data)
    outputs = dict(
        zip([o.name for o in session.get_outputs()], session.run(None, inputs), strict=True)
    )
    np.savez(folder / "golden.npz", **{f"input:{k}": v for k, v in inputs.items()},
             **{f"output:{k}": v for k, v in outputs.items()})  # fmt: skip
    variant = next(v for v in manifest["variants"] if v["format"] == "onnx")
    variant.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    manifest.update(version=version, variants=[variant])
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return file


def with_sparse_member(archive: bytes, name: str, size: int) -> bytes:
    """``archive`` (a tar) with one more member: a GNU sparse file of ``size`` bytes that
    stores none of them, all one hole (512 bytes of archive, ``size`` bytes when read).

    The header is built by hand: Python's tarfile reads sparse members but never
    writes them.
    """
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        last = tar.getmembers()[-1]
    end = last.offset_data + -(-last.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size = tarfile.GNUTYPE_SPARSE, 0o600, 0  # 0 bytes stored
    header = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    header[483:495] = tarfile.itn(size, 12, tarfile.GNU_FORMAT)  # its real size
    header[148:156] = b" " * 8  # the checksum is summed over blanks in its place
    header[148:156] = b"%06o\0 " % sum(header)
    return archive[:end] + bytes(header) + b"\0" * (2 * tarfile.BLOCKSIZE)


def low_and_high_confidence() -> tuple[np.ndarray, np.ndarray]:
    from edge_core.runtime import open_variant

    package = ModelRepository(MODELS).get("digits-light")
    session = open_variant(
        package, package.variant("onnx-int8"), RuntimeOptions(threads=1, warmup=0)
    )
    x, _ = package.evaluation()
    x = x.astype(np.float32)
    confidence = session.run({"pixels": x})["probabilities"].max(axis=1)
    return x[np.argmin(confidence)][None], x[np.argmax(confidence)][None]
