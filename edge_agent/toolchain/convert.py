"""The variants of an ONNX model: FP32 optimized offline, FP16, INT8 (static QDQ, dynamic).

- FP32: ONNX Runtime's *basic* graph optimizations applied once, offline
  (constant folding, redundant-node removal, Conv+BatchNorm and other fusions
  into standard ONNX operators): the result still runs on any execution
  provider, unlike the *extended* and *all* levels, which write ONNX Runtime's
  own fused operators and the CPU's memory layouts.
- FP16: ``onnxconverter-common``'s converter with float inputs and outputs
  kept. Before converting, the FP32 model runs the calibration data with
  every intermediate tensor exposed; an operator whose output or input comes
  near the FP16 range (65,504; Swish/SiLU pre-activations of a large model do)
  stays in FP32 (``guard``), and those tensors are reported.
- INT8 static: QDQ through ``onnxruntime.quantization`` with the calibration
  data and one calibration method (MinMax, Entropy, Percentile), weights per
  channel or per tensor; unsigned 8-bit
  activations and signed 8-bit weights (ONNX Runtime's fast path on x86 with VNNI
  and on ARM with dot products).
  QDQ with weights per channel needs opset 13: older models are upgraded.
- INT8 dynamic: weights quantized ahead, activations at run time
  (MatMul-heavy models).

Each function takes and returns a model's bytes; ONNX Runtime's tools work on
files, kept in a temporary folder.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.toolchain.onnx_graph import load_onnx

__all__ = [
    "FP16_MAX",
    "RangeFinding",
    "fp16",
    "int8_dynamic",
    "int8_static",
    "name_nodes",
    "node_count",
    "optimize_fp32",
    "tensor_ranges",
]

log = logging.getLogger(__name__)

Array = np.ndarray[Any, Any]
FP16_MAX = 65504.0
# How close to the FP16 range a tensor may come before its operators stay in FP32: the
# next operator (an Add, a Mul, a Softmax's exponent) can take it the rest of the way.
FP16_MARGIN = 4.0
QDQ_OPSET = 13


def _serialize(model: Any) -> bytes:
    return bytes(model.SerializeToString())


def name_nodes(data: bytes) -> bytes:
    """The model with every unnamed node named ``<op>_<index>`` (the FP16 block list
    and the reports name nodes)."""
    model = load_onnx(data)
    changed = False
    for index, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{index}"
            changed = True
    return _serialize(model) if changed else data


def node_count(data: bytes) -> int:
    return len(load_onnx(data).graph.node)


def optimize_fp32(data: bytes) -> bytes:
    """ONNX Runtime's basic offline optimization of ``data`` (portable ONNX out)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "optimized.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(out)
        options.log_severity_level = 3
        ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        return name_nodes(out.read_bytes())


@dataclass(frozen=True)
class RangeFinding:
    """A tensor whose values come near the FP16 range on the calibration data."""

    tensor: str
    max_abs: float
    producer: str  # node name ("" for a graph input)
    consumers: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "tensor": self.tensor,
            "max_abs": self.max_abs,
            "producer": self.producer,
            "consumers": list(self.consumers),
        }


def tensor_ranges(data: bytes, items: Sequence[dict[str, Array]]) -> dict[str, float]:
    """The largest absolute value of every float tensor (inputs, intermediates,
    outputs) over ``items``, running the FP32 model unoptimized."""
    import onnx
    import onnxruntime as ort

    model = onnx.shape_inference.infer_shapes(load_onnx(data))
    graph = model.graph
    floats = {
        v.name
        for v in [*graph.value_info, *graph.output, *graph.input]
        if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    }
    present = {v.name for v in graph.output}
    for value in graph.value_info:
        if value.name in floats and value.name not in present:
            graph.output.append(value)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(_serialize(model), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs() if o.name in floats]
    ranges: dict[str, float] = {}
    for item in items:
        for name, value in item.items():
            ranges[name] = max(ranges.get(name, 0.0), float(np.max(np.abs(value), initial=0.0)))
        for name, value in zip(names, session.run(names, item), strict=True):
            finite = np.abs(value[np.isfinite(value)]) if value.size else value
            peak = float(np.max(finite, initial=0.0)) if np.all(np.isfinite(value)) else np.inf
            ranges[name] = max(ranges.get(name, 0.0), peak)
    return ranges


def fp16_risks(data: bytes, items: Sequence[dict[str, Array]]) -> list[RangeFinding]:
    """The tensors that come within :data:`FP16_MARGIN` of the FP16 range."""
    model = load_onnx(data)
    producer = {name: node.name for node in model.graph.node for name in node.output}
    consumers: dict[str, list[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node.name)
    return [
        RangeFinding(name, round(peak, 1), producer.get(name, ""), tuple(consumers.get(name, [])))
        for name, peak in sorted(tensor_ranges(data, items).items())
        if peak * FP16_MARGIN > FP16_MAX
    ]


def fp16(
    data: bytes, items: Sequence[dict[str, Array]], *, guard: bool = True
) -> tuple[bytes, list[RangeFinding], list[str]]:
    """The FP16 variant of ``data``: bytes, the tensors at risk of overflow, and the
    nodes kept in FP32 because of them (none when ``guard`` is off)."""
    from onnxconverter_common import float16

    risks = fp16_risks(data, items)
    blocked = sorted(
        {n for r in risks for n in (r.producer, *r.consumers) if n} if guard else set()
    )
    model = load_onnx(data)
    with warnings.catch_warnings():  # one warning per weight it rounds to FP16's range
        warnings.simplefilter("ignore", UserWarning)
        converted = float16.convert_float_to_float16(
            model,
            keep_io_types=True,
            max_finite_val=FP16_MAX,
            node_block_list=blocked or None,
        )
    return _serialize(_no_round_trips(_float_outputs(converted))), risks, blocked


def _no_round_trips(model: Any) -> Any:
    """Cast-to-FP16-and-back pairs between two operators kept in FP32 removed: the
    converter casts every blocked operator's output to FP16, even when only FP32
    operators read it, and a value past the FP16 range becomes ``inf`` in that Cast."""
    from onnx import TensorProto

    graph = model.graph
    outputs = {o.name for o in graph.output}
    users: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            users.setdefault(name, []).append(node)

    def casts_to(node: Any, dtype: int) -> bool:
        return node.op_type == "Cast" and any(
            a.name == "to" and a.i == dtype for a in node.attribute
        )

    dropped = []
    for node in graph.node:
        readers = users.get(node.output[0], []) if node.output else []
        if not casts_to(node, TensorProto.FLOAT16) or node.output[0] in outputs or not readers:
            continue
        if all(casts_to(r, TensorProto.FLOAT) for r in readers):
            for reader in readers:
                reader.op_type = "Identity"
                reader.input[0] = node.input[0]
                del reader.attribute[:]
            dropped.append(node)
    for node in dropped:
        graph.node.remove(node)
    return model


def _float_outputs(model: Any) -> Any:
    """Outputs made FP32 again where the converter left them FP16 (it does, despite
    ``keep_io_types``, for an output whose producer is in the block list): a Cast to
    FP32 after each."""
    from onnx import TensorProto, helper

    for output in model.graph.output:
        tensor = output.type.tensor_type
        if tensor.elem_type != TensorProto.FLOAT16:
            continue
        inner = f"{output.name}_fp16"
        for node in model.graph.node:
            node.output[:] = [inner if n == output.name else n for n in node.output]
            node.input[:] = [inner if n == output.name else n for n in node.input]
        model.graph.node.append(
            helper.make_node("Cast", [inner], [output.name], name=f"{output.name}_to_fp32",
                             to=TensorProto.FLOAT)
        )  # fmt: skip
        tensor.elem_type = TensorProto.FLOAT
    return model


class _Reader:
    """``onnxruntime.quantization``'s calibration data reader over items."""

    def __init__(self, items: Sequence[dict[str, Array]]) -> None:
        self._all = items
        self._items = iter(items)

    def get_next(self) -> dict[str, Array] | None:
        return next(self._items, None)

    def rewind(self) -> None:
        self._items = iter(self._all)


def _for_quantization(data: bytes) -> bytes:
    """``data`` made ready for the quantizer: opset 13 at least (QDQ per channel), and
    each division by a constant a multiplication by its reciprocal (an operator
    replacement: ONNX Runtime quantizes Mul, not Div, so a Div between quantized
    operators -- h-swish's ``x * clip(x + 3, 0, 6) / 6`` -- would cost a
    dequantize and a quantize of its own)."""
    from onnx import numpy_helper, version_converter

    model = load_onnx(data)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < QDQ_OPSET:
        model = version_converter.convert_version(model, QDQ_OPSET)
    graph = model.graph
    constants = {init.name: init for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = node.attribute[0].t
    for node in graph.node:
        divisor = constants.get(node.input[1]) if node.op_type == "Div" else None
        if divisor is None:
            continue
        value = numpy_helper.to_array(divisor)
        if value.dtype != np.float32 or not np.all(value != 0):
            continue
        name = f"{node.name or node.output[0]}_reciprocal"
        graph.initializer.append(numpy_helper.from_array((1.0 / value).astype(np.float32), name))
        node.op_type = "Mul"
        node.input[1] = name
    return _serialize(model)


def int8_static(
    data: bytes,
    items: Sequence[dict[str, Array]],
    *,
    method: str = "MinMax",
    per_channel: bool = True,
    keep_fp32: Sequence[str] = (),
) -> bytes:
    """Static INT8 (QDQ) of ``data`` calibrated on ``items`` with ``method``; the nodes
    named in ``keep_fp32`` stay in FP32."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(_Reader, CalibrationDataReader):  # type: ignore[misc]
        pass

    # the calibrators print their progress on stdout: the command's output is its own
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        src, pre, dst = (Path(tmp) / n for n in ("fp32.onnx", "pre.onnx", "int8.onnx"))
        src.write_bytes(_for_quantization(data))
        # shapes for the quantizer; the graph was optimized already, and symbolic shape
        # inference refuses graphs whose sizes are computed at run time
        quant_pre_process(str(src), str(pre), skip_optimization=True, skip_symbolic_shape=True)
        quantize_static(
            str(pre),
            str(dst),
            Reader(items),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=per_channel,
            calibrate_method=getattr(CalibrationMethod, method),
            nodes_to_exclude=list(keep_fp32),
        )
        return dst.read_bytes()


def int8_dynamic(data: bytes) -> bytes:
    """Dynamic INT8 of ``data``: weights quantized now, activations at run time."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        src.write_bytes(data)
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
        return dst.read_bytes()
