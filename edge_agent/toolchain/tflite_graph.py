"""A TFLite model's figures, from what the LiteRT interpreter exposes of its flatbuffer.

The interpreter lists the operators in execution order with their input and
output tensors, and every tensor's type and shape once allocated: enough for
the same figures as an ONNX graph's. Weights are the tensors no operator
produces and no input feeds; a ``DEQUANTIZE`` of a weight (FP16 weights, as
in BlazeFace) happens once, when the model is prepared, and runs in FP32 after.
An operator computes in INT8 when its first input is 8-bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
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


def _conv_macs(ins: list[Any], out: Any) -> int:
    """Weights ``[c_out, k_h, k_w, c_in / g]``: ``k_h·k_w·c_in/g`` per output element."""
    return _size(out) * _size(ins[1][1:]) if len(ins) > 1 else 0


def _depthwise_macs(ins: list[Any], out: Any) -> int:
    """Weights ``[1, k_h, k_w, c_out]``: ``k_h·k_w`` per output element."""
    return _size(out) * _size(ins[1][1:3]) if len(ins) > 1 else 0


def _fully_connected_macs(ins: list[Any], out: Any) -> int:
    """Weights ``[units, depth]``: ``depth`` per output element."""
    return _size(out) * int(ins[1][-1]) if len(ins) > 1 else 0


def _transpose_conv_macs(ins: list[Any], out: Any) -> int:
    """Inputs: output shape, weights ``[c_out, k_h, k_w, c_in]``, input: every input
    element is spread over ``c_out·k_h·k_w`` outputs."""
    return _size(ins[2]) * _size(ins[1][:3]) if len(ins) > 2 else 0


def _batch_matmul_macs(ins: list[Any], out: Any) -> int:
    """The left operand's last dimension per output element."""
    return _size(out) * int(ins[0][-1]) if ins else 0


# the linear operators, by op name: their multiply-accumulates from the shapes of their
# inputs (in the operator's order, ``None`` where absent) and of their first output
_MACS: dict[str, Callable[[list[Any], Any], int]] = {
    "CONV_2D": _conv_macs,
    "DEPTHWISE_CONV_2D": _depthwise_macs,
    "FULLY_CONNECTED": _fully_connected_macs,
    "TRANSPOSE_CONV": _transpose_conv_macs,
    "BATCH_MATMUL": _batch_matmul_macs,
}


def _flops(op: str, macs: int, out_size: int, inputs: int) -> int:
    """Two operations a multiply-accumulate, plus one an output element for a bias (a
    third input); other operators one an output element, shape operators none."""
    if macs:
        return 2 * macs + (out_size if inputs > 2 else 0)
    return 0 if op in SHAPE_OPS else out_size


@dataclass(frozen=True)
class _Graph:
    """What the interpreter tells of a model's tensors: each by index, the model's
    inputs and outputs, and which are weights."""

    tensors: dict[int, Any]
    inputs: set[int]
    outputs: list[int]
    constants: set[int]  # no operator makes them and no input feeds them: weights
    dequantized: set[int]  # a DEQUANTIZE of a weight: it runs once, at preparation

    @classmethod
    def of(cls, interpreter: Any, ops: list[Any]) -> _Graph:
        inputs = {int(d["index"]) for d in interpreter.get_input_details()}
        produced = {int(i) for op in ops for i in op["outputs"]}
        constants = {
            int(i)
            for op in ops
            for i in op["inputs"]
            if i >= 0 and i not in produced and i not in inputs
        }
        return cls(
            tensors={int(t["index"]): t for t in interpreter.get_tensor_details()},
            inputs=inputs,
            outputs=[int(d["index"]) for d in interpreter.get_output_details()],
            constants=constants,
            dequantized={
                int(op["outputs"][0])
                for op in ops
                if op["op_name"] == "DEQUANTIZE" and int(op["inputs"][0]) in constants
            },
        )

    def shape(self, index: int) -> Any:
        return self.tensors[index]["shape"] if index in self.tensors else None

    def nbytes(self, index: int) -> int:
        return _size(self.shape(index)) * int(np.dtype(self.tensors[index]["dtype"]).itemsize)

    def elements(self, indices: Iterable[int]) -> int:
        return sum(_size(self.shape(i)) for i in indices)

    def total_bytes(self, indices: Iterable[int]) -> int:
        return sum(self.nbytes(i) for i in indices)

    def precision(self, activations: list[int]) -> str:
        """``int8`` when the operator's first activation is 8-bit, else ``fp32``."""
        first = self.tensors.get(activations[0] if activations else -1)
        return "int8" if first is not None and np.dtype(first["dtype"]).itemsize == 1 else "fp32"


def _load(data: bytes, batch: int) -> tuple[Any, list[Any]]:
    """The interpreter, allocated at ``batch`` where the batch is dynamic, and its operators.

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
        return interpreter, interpreter._get_ops_details()
    except (ValueError, RuntimeError) as exc:
        raise FiguresError(f"LiteRT cannot load the model: {exc}") from exc


def _op_figures(graph: _Graph, op: Any) -> OpFigures:
    """One operator's figures; a reshape, or the DEQUANTIZE of a weight, costs nothing."""
    name = str(op["op_name"])
    ins = [int(i) for i in op["inputs"] if i >= 0]
    outs = [int(i) for i in op["outputs"] if i >= 0]
    weights = [i for i in ins if i in graph.constants or i in graph.dequantized]
    activations = [i for i in ins if i not in weights]
    label, precision = f"{name.lower()}_{op['index']}", graph.precision(activations)
    if name in FREE or (outs and outs[0] in graph.dequantized):
        return OpFigures(name=label, op_type=name, precision=precision, fused=True)
    out_shape = graph.shape(outs[0]) if outs else None
    handler = _MACS.get(name)
    macs = handler([graph.shape(i) for i in op["inputs"]], out_shape) if handler else 0
    return OpFigures(
        name=label,
        op_type=name,
        precision=precision,
        macs=macs,
        flops=_flops(name, macs, _size(out_shape) if outs else 0, len(ins)),
        depthwise=name == "DEPTHWISE_CONV_2D",
        params=graph.elements(weights),
        weight_bytes=graph.total_bytes(weights),
        input_bytes=graph.total_bytes(activations),
        output_bytes=graph.total_bytes(outs),
    )


def tflite_figures(data: bytes, *, batch: int = 1) -> ModelFigures:
    """Count the figures of a TFLite model (``batch``: where its batch is dynamic).

    Raises:
        FiguresError: LiteRT cannot load the model.
    """
    interpreter, ops = _load(data, batch)
    graph = _Graph.of(interpreter, ops)
    inputs, tensors, shape = sorted(graph.inputs), graph.tensors, graph.shape
    return ModelFigures(
        format="tflite",
        batch=batch,
        inputs=tuple(_spec(tensors[i]) for i in inputs),
        outputs=tuple(_spec(tensors[i]) for i in graph.outputs),
        ops=tuple(_op_figures(graph, op) for op in ops),
        params=graph.elements(graph.constants),
        weight_bytes=graph.total_bytes(graph.constants),
        activation_peak_bytes=_peak(
            ops, graph.inputs, graph.outputs, graph.constants | graph.dequantized, graph.nbytes
        ),
        shapes={tensors[i]["name"]: tuple(int(d) for d in shape(i)) for i in inputs},
        notes=("TFLite: FP16 weights are dequantized once at load and run in FP32",)
        if graph.dequantized
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
