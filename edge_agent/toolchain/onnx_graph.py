"""An ONNX graph's figures (:class:`~edge_agent.toolchain.figures.ModelFigures`).

Shapes come from ONNX shape inference on a copy of the model whose inputs are
made concrete: dynamic batch dimensions take the batch size asked for, other
dynamic dimensions the sizes given (``--shape x=1,3,480,640``). Where ONNX's
own inference leaves a tensor without a shape (shapes computed at run time:
``Reshape`` of a ``Shape``, ``Resize`` to computed sizes), ONNX Runtime's
symbolic shape inference (``sympy``) takes over.

Quantized graphs in the QDQ format are counted as ONNX Runtime runs them:
``DequantizeLinear → op → QuantizeLinear`` becomes one integer kernel, so the
op computes in INT8, reads and writes 8-bit tensors, and the Q/DQ nodes cost
nothing of their own.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.toolchain.figures import ModelFigures, OpFigures
from edge_core.errors import EdgeError
from edge_core.tensors import TensorSpec, datatype_of

__all__ = ["FiguresError", "load_onnx", "onnx_figures", "static_input_shapes"]

QDQ = {"QuantizeLinear", "DequantizeLinear"}
# No time of their own: folded at load, or views of their input.
FREE = {"Constant", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Shape", *QDQ}
# Move data, compute nothing.
SHAPE_OPS = FREE | {
    "Transpose", "Concat", "Split", "Slice", "Gather", "Cast", "Expand", "ConstantOfShape",
    "Pad", "Tile", "DepthToSpace", "SpaceToDepth", "Range", "NonZero",
}  # fmt: skip
INTEGER_OPS = {"QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger"}


class FiguresError(EdgeError):
    """A model's figures cannot be counted (a dynamic size not given, a graph ONNX refuses)."""


def load_onnx(source: bytes | Path) -> Any:
    """An ``onnx.ModelProto`` from a file's bytes or path.

    Raises:
        FiguresError: not an ONNX model.
    """
    import onnx
    from google.protobuf.message import DecodeError

    try:
        if isinstance(source, bytes):
            return onnx.load_from_string(source)
        return onnx.load(str(source))
    except (DecodeError, OSError, ValueError) as exc:
        raise FiguresError(f"not an ONNX model: {exc}") from exc


def _graph_inputs(graph: Any) -> list[Any]:
    initializers = {init.name for init in graph.initializer}
    return [value for value in graph.input if value.name not in initializers]


def static_input_shapes(
    model: Any, batch: int, given: Mapping[str, Sequence[int]] | None = None
) -> dict[str, tuple[int, ...]]:
    """Each input's shape with dynamic dimensions resolved: the first one to
    ``batch``, the others from ``given``.

    Raises:
        FiguresError: a dynamic dimension other than the batch has no size.
    """
    given = given or {}
    shapes = {}
    for value in _graph_inputs(model.graph):
        if value.name in given:
            shapes[value.name] = tuple(int(d) for d in given[value.name])
            continue
        dims = []
        for index, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                dims.append(dim.dim_value)
            elif index == 0:
                dims.append(batch)
            else:
                label = dim.dim_param or "?"
                raise FiguresError(
                    f"input {value.name!r} has a dynamic dimension {index} ({label}): give its "
                    f"shape, e.g. --shape {value.name}=" + ",".join(["1"] * (index + 1)) + ",..."
                )
        shapes[value.name] = tuple(dims)
    return shapes


def _infer(model: Any, shapes: Mapping[str, tuple[int, ...]]) -> tuple[Any, list[str]]:
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.graph.value_info[:]
    for value in _graph_inputs(copy.graph):
        dims = value.type.tensor_type.shape.dim
        for dim, size in zip(dims, shapes[value.name], strict=True):
            dim.Clear()
            dim.dim_value = size
    notes = []
    try:
        inferred = onnx.shape_inference.infer_shapes(copy, data_prop=True)
    except (onnx.shape_inference.InferenceError, ValueError) as exc:
        raise FiguresError(f"ONNX shape inference failed: {exc}") from exc
    if _unknown(inferred):
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        try:
            with _elsewhere():  # where it fails, it leaves a model file in the working folder
                symbolic = SymbolicShapeInference.infer_shapes(inferred, auto_merge=True)
        except Exception as exc:  # its own errors are bare Exceptions
            notes.append(f"symbolic shape inference failed ({exc})")
        else:
            if symbolic is not None:
                inferred = symbolic
                notes.append("shapes inferred symbolically (ONNX Runtime's symbolic_shape_infer)")
    missing = _unknown(inferred)
    if missing:
        notes.append(f"{len(missing)} tensors without a static shape count 0 bytes: {missing[:3]}")
    return inferred, notes


@contextlib.contextmanager
def _elsewhere() -> Iterator[None]:
    """Run in a temporary working folder (removed after)."""
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            yield
        finally:
            os.chdir(here)


def _types(model: Any) -> dict[str, tuple[np.dtype[Any], tuple[int, ...] | None]]:
    from onnx import helper

    out: dict[str, tuple[np.dtype[Any], tuple[int, ...] | None]] = {}
    graph = model.graph
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        if not tensor.elem_type:
            continue
        dims = tensor.shape.dim
        static = all(d.HasField("dim_value") for d in dims) and tensor.HasField("shape")
        shape = tuple(d.dim_value for d in dims) if static else None
        out[value.name] = (np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)), shape)
    for init in graph.initializer:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type))
        out[init.name] = (dtype, tuple(init.dims))
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            value = node.attribute[0].t
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(value.data_type))
            out[node.output[0]] = (dtype, tuple(value.dims))
    return out


def _unknown(model: Any) -> list[str]:
    types = _types(model)
    return [
        name
        for node in model.graph.node
        for name in node.output
        if name and (name not in types or types[name][1] is None)
    ]


def _size(shape: tuple[int, ...] | None) -> int:
    return int(np.prod(shape)) if shape is not None else 0


def _attribute(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return default


def _weight(node: Any, shape: Any) -> Any:
    """A convolution's weight shape (``QLinearConv`` takes it fourth, after the input's
    scale and zero point)."""
    return shape(node.input[3] if node.op_type == "QLinearConv" else node.input[1])


def _conv_macs(node: Any, shape: Any, out: tuple[int, ...]) -> int:
    """Output positions × ``c_out`` × ``k_h·k_w·c_in/g``: the seed's ``k_h·k_w·c_in·c_out/g``
    per output position."""
    weight = _weight(node, shape)
    return _size(out) * _size(weight[1:]) if weight else 0


def _conv_transpose_macs(node: Any, shape: Any, out: tuple[int, ...]) -> int:
    """Every input element spread over the weight's ``c_out/g·k_h·k_w`` outputs."""
    x, weight = shape(node.input[0]), shape(node.input[1])
    return _size(x) * _size(weight[1:]) if x and weight else 0


def _gemm_macs(node: Any, shape: Any, out: tuple[int, ...]) -> int:
    """The inner dimension of ``A`` (transposed or not) per output element."""
    a = shape(node.input[0])
    if not a:
        return 0
    return _size(out) * int(a[0 if _attribute(node, "transA", 0) else 1])


def _matmul_macs(node: Any, shape: Any, out: tuple[int, ...]) -> int:
    """The left operand's last dimension per output element."""
    a = shape(node.input[0])
    return _size(out) * a[-1] if a else 0


# the linear operators, by op type: their multiply-accumulates from the graph's shapes
# (``shape``: a tensor name's shape) and their output's shape
_MACS: dict[str, Callable[[Any, Any, tuple[int, ...]], int]] = {
    "Conv": _conv_macs,
    "ConvInteger": _conv_macs,
    "QLinearConv": _conv_macs,
    "ConvTranspose": _conv_transpose_macs,
    "Gemm": _gemm_macs,
    "MatMul": _matmul_macs,
    "MatMulInteger": _matmul_macs,
    "QLinearMatMul": _matmul_macs,
}


def _macs(node: Any, shape: Any) -> int:
    """Multiply-accumulates of the linear operators (``shape``: a tensor name's shape);
    none where the output's shape is unknown."""
    out = shape(node.output[0])
    handler = _MACS.get(node.op_type)
    return handler(node, shape, out) if handler is not None and out is not None else 0


def _depthwise(node: Any, shape: Any) -> bool:
    """Whether ``node`` is a depthwise convolution: one input channel a group."""
    if node.op_type not in ("Conv", "ConvInteger", "QLinearConv"):
        return False
    weight = _weight(node, shape)
    return bool(weight) and len(weight) > 1 and weight[1] == 1 and _attribute(node, "group", 1) > 1


def _flops(node: Any, macs: int, shape: Any) -> int:
    op = node.op_type
    out = _size(shape(node.output[0]))
    if macs:
        biased = op in ("Conv", "ConvTranspose", "Gemm") and len(node.input) > 2 and node.input[2]
        return 2 * macs + (out if biased else 0)
    if op in SHAPE_OPS:
        return 0
    if op in ("MaxPool", "AveragePool", "LpPool"):
        return out * int(np.prod(_attribute(node, "kernel_shape", [1])))
    if op.startswith(("Global", "Reduce")):
        return _size(shape(node.input[0]))
    if op == "BatchNormalization":
        return 2 * out
    return out


@dataclass(frozen=True)
class _Graph:
    """An inferred graph as the counting sees it: each tensor's type and shape, its
    producer and its consumers, and which tensors are weights."""

    graph: Any
    types: dict[str, tuple[np.dtype[Any], tuple[int, ...] | None]]
    constants: set[str]  # initializers and Constant outputs
    producer: dict[str, Any]
    consumers: dict[str, list[Any]]

    @classmethod
    def of(cls, model: Any) -> _Graph:
        graph = model.graph
        consumers: dict[str, list[Any]] = {}
        for node in graph.node:
            for name in node.input:
                consumers.setdefault(name, []).append(node)
        return cls(
            graph=graph,
            types=_types(model),
            constants={init.name for init in graph.initializer}
            | {n.output[0] for n in graph.node if n.op_type == "Constant"},
            producer={name: node for node in graph.node for name in node.output},
            consumers=consumers,
        )

    def shape(self, name: str) -> tuple[int, ...] | None:
        return self.types.get(name, (None, None))[1]

    def _made_by(self, name: str, op_type: str) -> Any:
        """The node that makes ``name`` if it is an ``op_type``, else ``None``."""
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def itemsize(self, name: str) -> int:
        """Bytes per element as the runtime holds it (8-bit between fused Q/DQ)."""
        dequantize = self._made_by(name, "DequantizeLinear")
        if dequantize is not None:
            return self.itemsize(dequantize.input[0])
        users = self.consumers.get(name, [])
        if users and all(u.op_type == "QuantizeLinear" for u in users):
            return self.itemsize(users[0].output[0])
        dtype = self.types.get(name, (None, None))[0]
        return dtype.itemsize if dtype is not None else 0

    def nbytes(self, name: str) -> int:
        return _size(self.shape(name)) * self.itemsize(name)

    def is_weight(self, name: str) -> bool:
        """An initializer or a constant, or the dequantized copy of one."""
        dequantize = self._made_by(name, "DequantizeLinear")
        if dequantize is not None:
            return dequantize.input[0] in self.constants
        return name in self.constants

    def precision(self, node: Any) -> str:
        """``int8`` for an integer kernel, a Q/DQ node or a node fed by a
        ``DequantizeLinear`` (ONNX Runtime fuses it); else its output's float type."""
        quantized = node.op_type in INTEGER_OPS or any(
            self._made_by(n, "DequantizeLinear") is not None for n in node.input
        )
        out_dtype = self.types.get(node.output[0], (None, None))[0] if node.output else None
        return (
            "int8" if quantized or node.op_type in QDQ
            else "fp16" if out_dtype == np.float16
            else "fp32"
        )  # fmt: skip


def _node_figures(graph: _Graph, node: Any) -> OpFigures:
    """One node's figures; a view, a folded constant or a fused Q/DQ costs nothing."""
    name, precision = node.name or node.output[0], graph.precision(node)
    if node.op_type in FREE:
        return OpFigures(name=name, op_type=node.op_type, precision=precision, fused=True)
    params = weight_bytes = input_bytes = 0
    for tensor in filter(None, node.input):
        if graph.is_weight(tensor):
            params += _size(graph.shape(tensor))
            weight_bytes += graph.nbytes(tensor)
        else:
            input_bytes += graph.nbytes(tensor)
    macs = _macs(node, graph.shape)
    return OpFigures(
        name=name,
        op_type=node.op_type,
        precision=precision,
        macs=macs,
        flops=_flops(node, macs, graph.shape),
        depthwise=_depthwise(node, graph.shape),
        params=params,
        weight_bytes=weight_bytes,
        input_bytes=input_bytes,
        output_bytes=sum(graph.nbytes(n) for n in node.output if n),
    )


def onnx_figures(
    source: bytes | Path | Any,
    *,
    batch: int = 1,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> ModelFigures:
    """Count the figures of an ONNX model at ``batch`` (``shapes``: dynamic sizes).

    Raises:
        FiguresError: not an ONNX model, a dynamic size not given, shapes that
            cannot be inferred.
    """
    model: Any = source if hasattr(source, "graph") else load_onnx(source)
    concrete = static_input_shapes(model, batch, shapes)
    inferred, notes = _infer(model, concrete)
    graph = _Graph.of(inferred)
    nodes = graph.graph.node
    if any(_attribute(n, "body", None) or _attribute(n, "then_branch", None) for n in nodes):
        notes.append("subgraphs (If, Loop, Scan) are counted as one node each")
    types, constants = graph.types, graph.constants
    return ModelFigures(
        format="onnx",
        batch=batch,
        inputs=tuple(_spec(v, types) for v in _graph_inputs(model.graph)),
        outputs=tuple(_spec(v, types) for v in model.graph.output),
        ops=tuple(_node_figures(graph, node) for node in nodes),
        params=sum(_size(types[name][1]) for name in constants),
        weight_bytes=sum(_size(types[name][1]) * types[name][0].itemsize for name in constants),
        activation_peak_bytes=_activation_peak(graph.graph, constants, graph.shape, graph.itemsize),
        opset=next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
        shapes=concrete,
        notes=tuple(notes),
    )


def _spec(value: Any, types: Mapping[str, Any]) -> TensorSpec:
    from onnx import helper

    tensor = value.type.tensor_type
    dims = tuple(
        d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tensor.shape.dim
    )
    try:
        datatype = datatype_of(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    except (ValueError, KeyError):
        datatype = "BYTES"
    return TensorSpec(value.name, datatype, dims)


def _activation_peak(graph: Any, constants: set[str], shape: Any, itemsize: Any) -> int:
    """The most bytes of activations alive at once, running the nodes in file order
    (a valid ONNX graph lists them topologically)."""
    nodes = list(graph.node)
    born: dict[str, int] = {v.name: -1 for v in _graph_inputs(graph)}
    last: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.output:
            if name:
                born.setdefault(name, index)
        for name in node.input:
            if name:
                last[name] = index
    for value in graph.output:
        last[value.name] = len(nodes)
    change = np.zeros(len(nodes) + 3, dtype=np.int64)
    for name, start in born.items():
        if name in constants or (name in born and producer_is_free(nodes, start)):
            continue
        end = last.get(name, start)
        change[start + 1] += _size(shape(name)) * itemsize(name)
        change[end + 2] -= _size(shape(name)) * itemsize(name)
    return int(np.cumsum(change).max(initial=0))


def producer_is_free(nodes: list[Any], index: int) -> bool:
    """Whether the node at ``index`` makes a view or a folded value (no memory of its own)."""
    return index >= 0 and nodes[index].op_type in FREE
