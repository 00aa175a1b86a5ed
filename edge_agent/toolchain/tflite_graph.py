"""A TFLite model's figures, from what the LiteRT interpreter exposes of its flatbuffer.

The interpreter lists the operators in execution order with their input and
output tensors, and every tensor's type and shape once allocated: enough for
the same figures as an ONNX graph's. Weights are the tensors no operator
produces and no input feeds; a ``DEQUANTIZE`` of a weight (FP16 weights, as
in BlazeFace) happens once, when the model is prepared, and runs in FP32 after.
An operator computes in INT8 when its first input is 8-bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edge_agent.toolchain.figures import ModelFigures, OpFigures
from edge_agent.toolchain.onnx_graph import FiguresError
from edge_core.tensors import TensorSpec, datatype_of

__all__ = ["tflite_figures"]

SHAPE_OPS = {
    "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "CONCATENATION", "PAD", "PADV2",
    "SLICE", "STRIDED_SLICE", "GATHER", "SHAPE", "SPLIT", "PACK", "UNPACK",
}  # fmt: skip
FREE = {"RESHAPE", "SQUEEZE", "EXPAND_DIMS", "SHAPE"}


def _size(shape: Any) -> int:
    return int(np.prod(shape)) if shape is not None else 0


def _macs(op: str, ins: list[Any], out: Any) -> int:
    if op == "CONV_2D" and len(ins) > 1:  # weights [c_out, k_h, k_w, c_in / g]
        return _size(out) * _size(ins[1][1:])
    if op == "DEPTHWISE_CONV_2D" and len(ins) > 1:  # weights [1, k_h, k_w, c_out]
        return _size(out) * _size(ins[1][1:3])
    if op == "FULLY_CONNECTED" and len(ins) > 1:
        return _size(out) * int(ins[1][-1])
    if op == "TRANSPOSE_CONV" and len(ins) > 2:  # output shape, weights, input
        return _size(ins[2]) * _size(ins[1][:3])
    if op == "BATCH_MATMUL" and ins:
        return _size(out) * int(ins[0][-1])
    return 0


def tflite_figures(data: bytes, *, batch: int = 1) -> ModelFigures:
    """Count the figures of a TFLite model (``batch``: where its batch is dynamic).

    Raises:
        FiguresError: LiteRT cannot load the model.
    """
    from edge_core.runtime.litert import _import_litert

    module = _import_litert()
    try:
        # without XNNPACK: its delegate would stand for the operators it takes over
        interpreter = module.Interpreter(
            model_content=data,
            experimental_op_resolver_type=module.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        )
        for detail in interpreter.get_input_details():
            signature = detail.get("shape_signature")
            if signature is not None and len(signature) and signature[0] < 0:
                interpreter.resize_tensor_input(detail["index"], [batch, *detail["shape"][1:]])
        interpreter.allocate_tensors()
        ops = interpreter._get_ops_details()
    except (ValueError, RuntimeError) as exc:
        raise FiguresError(f"LiteRT cannot load the model: {exc}") from exc
    tensors = {int(t["index"]): t for t in interpreter.get_tensor_details()}
    inputs = {int(d["index"]) for d in interpreter.get_input_details()}
    outputs = [int(d["index"]) for d in interpreter.get_output_details()]
    produced = {int(i) for op in ops for i in op["outputs"]}
    constants = {
        int(i)
        for op in ops
        for i in op["inputs"]
        if i >= 0 and i not in produced and i not in inputs
    }
    # a DEQUANTIZE of a weight runs once, at preparation: its output is a weight too
    dequantized = {
        int(op["outputs"][0]) for op in ops
        if op["op_name"] == "DEQUANTIZE" and int(op["inputs"][0]) in constants
    }  # fmt: skip

    def shape(index: int) -> Any:
        return tensors[index]["shape"] if index in tensors else None

    def nbytes(index: int) -> int:
        return _size(shape(index)) * int(np.dtype(tensors[index]["dtype"]).itemsize)

    figures = []
    for op in ops:
        name = str(op["op_name"])
        ins = [int(i) for i in op["inputs"] if i >= 0]
        outs = [int(i) for i in op["outputs"] if i >= 0]
        free = name in FREE or (outs and outs[0] in dequantized)
        weights = [i for i in ins if i in constants or i in dequantized]
        activations = [i for i in ins if i not in weights]
        first = tensors.get(activations[0] if activations else -1)
        precision = (
            "int8" if first is not None and np.dtype(first["dtype"]).itemsize == 1 else "fp32"
        )
        out_size = _size(shape(outs[0])) if outs else 0
        macs = (
            0
            if free
            else _macs(name, [shape(i) for i in op["inputs"]], shape(outs[0]) if outs else None)
        )
        flops = 2 * macs + (out_size if macs and len(ins) > 2 else 0)
        if not macs and not free and name not in SHAPE_OPS:
            flops = out_size
        figures.append(
            OpFigures(
                name=f"{name.lower()}_{op['index']}",
                op_type=name,
                precision=precision,
                macs=macs,
                flops=0 if free else flops,
                depthwise=not free and name == "DEPTHWISE_CONV_2D",
                params=0 if free else sum(_size(shape(i)) for i in weights),
                weight_bytes=0 if free else sum(nbytes(i) for i in weights),
                input_bytes=0 if free else sum(nbytes(i) for i in activations),
                output_bytes=0 if free else sum(nbytes(i) for i in outs),
                fused=bool(free),
            )
        )
    return ModelFigures(
        format="tflite",
        batch=batch,
        inputs=tuple(_spec(tensors[i]) for i in sorted(inputs)),
        outputs=tuple(_spec(tensors[i]) for i in outputs),
        ops=tuple(figures),
        params=sum(_size(shape(i)) for i in constants),
        weight_bytes=sum(nbytes(i) for i in constants),
        activation_peak_bytes=_peak(ops, inputs, outputs, constants | dequantized, nbytes),
        shapes={tensors[i]["name"]: tuple(int(d) for d in shape(i)) for i in sorted(inputs)},
        notes=("TFLite: FP16 weights are dequantized once at load and run in FP32",)
        if dequantized
        else (),
    )


def _spec(detail: dict[str, Any]) -> TensorSpec:
    signature = detail.get("shape_signature")
    shape = signature if signature is not None and len(signature) else detail["shape"]
    return TensorSpec(
        str(detail["name"]), datatype_of(detail["dtype"]), tuple(int(d) for d in shape)
    )


def _peak(
    ops: list[Any], inputs: set[int], outputs: list[int], weights: set[int], nbytes: Any
) -> int:
    born = dict.fromkeys(inputs, -1)
    last: dict[int, int] = {}
    for index, op in enumerate(ops):
        for i in op["outputs"]:
            born.setdefault(int(i), index)
        for i in op["inputs"]:
            last[int(i)] = index
    for i in outputs:
        last[i] = len(ops)
    change = np.zeros(len(ops) + 3, dtype=np.int64)
    for tensor, start in born.items():
        if tensor in weights:
            continue
        change[start + 1] += nbytes(tensor)
        change[last.get(tensor, start) + 2] -= nbytes(tensor)
    return int(np.cumsum(change).max(initial=0))
