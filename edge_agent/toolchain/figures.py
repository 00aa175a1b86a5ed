"""The figures of one model, whatever its format: per operator, then totals.

A model's cost, as the seed documents count it: FLOPs (floating-point or
integer operations), parameters, weight bytes, the activation memory it needs
at once (the peak of live tensors along the topological order) and its
memory-access cost (every byte an operator reads or writes). Convolutions and
matrix products are counted in multiply-accumulates (MACs, two operations
each); a grouped or depthwise convolution costs ``k_h·k_w·c_in·c_out/g`` per
output position. Other operators count one operation per output element
(pooling: one per window element); shape operators none.

The totals per compute precision are what a device profile's roofline turns
into a latency (:mod:`edge_agent.profiles.cost`); they travel in the manifest
(:class:`edge_core.package.Cost`) so the agent can predict a variant's latency
without ``onnx``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from edge_core.package import Cost
from edge_core.report import render_table
from edge_core.tensors import TensorSpec, format_shape

__all__ = ["ModelFigures", "OpFigures", "format_figures"]


@dataclass(frozen=True)
class OpFigures:
    """One operator (an ONNX node, a TFLite op)."""

    name: str
    op_type: str
    precision: str  # the precision it computes in: fp32, fp16 or int8
    macs: int = 0
    flops: int = 0
    params: int = 0
    weight_bytes: int = 0
    input_bytes: int = 0  # activations read
    output_bytes: int = 0  # activations written
    # a convolution of one input channel a group: its own, far lower, rate
    depthwise: bool = False
    # folded into its neighbours by the runtime (QuantizeLinear/DequantizeLinear
    # around an integer kernel): no time of its own
    fused: bool = False

    @property
    def memory_bytes(self) -> int:
        return self.input_bytes + self.output_bytes + self.weight_bytes


@dataclass(frozen=True)
class ModelFigures:
    """What ``edge-agent models inspect`` reports for one model file."""

    format: str
    batch: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    ops: tuple[OpFigures, ...]
    params: int
    weight_bytes: int
    activation_peak_bytes: int
    opset: int | None = None
    # input name -> the shape the figures were counted at
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def macs(self) -> int:
        return sum(op.macs for op in self.ops)

    @property
    def flops(self) -> int:
        return sum(op.flops for op in self.ops)

    @property
    def memory_bytes(self) -> int:
        return sum(op.memory_bytes for op in self.ops if not op.fused)

    def cost(self) -> Cost:
        """The totals a roofline needs, per compute precision (fused operators left out)."""
        flops: dict[str, int] = {}
        elementwise: dict[str, int] = {}
        depthwise: dict[str, int] = {}
        for op in self.ops:
            if not op.fused and op.flops:
                into = depthwise if op.depthwise else flops if op.macs else elementwise
                into[op.precision] = into.get(op.precision, 0) + op.flops
        return Cost(
            flops=dict(sorted(flops.items())),
            elementwise=dict(sorted(elementwise.items())),
            depthwise=dict(sorted(depthwise.items())),
            memory_bytes=self.memory_bytes,
            nodes=sum(1 for op in self.ops if not op.fused),
            batch=self.batch,
        )

    def by_op_type(self) -> list[dict[str, Any]]:
        """Totals per operator type (depthwise convolutions apart), the costliest first."""
        groups: dict[tuple[str, str, bool], dict[str, Any]] = {}
        for op in self.ops:
            key = (op.op_type, op.precision, op.depthwise)
            entry = groups.setdefault(
                key,
                {"op_type": op.op_type, "precision": op.precision, "depthwise": op.depthwise,
                 "count": 0, "macs": 0, "flops": 0, "params": 0, "weight_bytes": 0,
                 "memory_bytes": 0},
            )  # fmt: skip
            entry["count"] += 1
            entry["macs"] += op.macs
            entry["flops"] += op.flops
            entry["params"] += op.params
            entry["weight_bytes"] += op.weight_bytes
            entry["memory_bytes"] += op.memory_bytes
        return sorted(groups.values(), key=lambda e: (-e["flops"], -e["count"], e["op_type"]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "opset": self.opset,
            "batch": self.batch,
            "shapes": {name: list(shape) for name, shape in self.shapes.items()},
            "inputs": [spec.to_dict() for spec in self.inputs],
            "outputs": [spec.to_dict() for spec in self.outputs],
            "nodes": len(self.ops),
            "params": self.params,
            "weight_bytes": self.weight_bytes,
            "macs": self.macs,
            "flops": self.flops,
            "activation_peak_bytes": self.activation_peak_bytes,
            "memory_access_bytes": self.memory_bytes,
            "cost": self.cost().to_dict(),
            "by_op_type": self.by_op_type(),
            "notes": list(self.notes),
        }


def _si(value: float, unit: str = "") -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def _bytes(value: float) -> str:
    for scale, prefix in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}"
    return f"{int(value)} B"


def format_figures(figures: ModelFigures, predictions: Iterable[tuple[str, str]] = ()) -> str:
    """The table ``edge-agent models inspect`` prints."""
    lines = []
    for what, specs in (("input", figures.inputs), ("output", figures.outputs)):
        for spec in specs:
            lines.append(f"{what:6}  {spec.name}: {spec.datatype} {format_shape(spec.shape)}")
    shapes = ", ".join(f"{n} {format_shape(s)}" for n, s in figures.shapes.items())
    opset = f", opset {figures.opset}" if figures.opset is not None else ""
    lines.append(
        f"format  {figures.format}{opset}; counted at {shapes or 'batch ' + str(figures.batch)}"
    )
    lines.append(
        f"totals  {len(figures.ops)} nodes, {_si(figures.params)} parameters "
        f"({_bytes(figures.weight_bytes)}), {_si(figures.macs, 'MAC')}, "
        f"{_si(figures.flops, 'FLOP')}, activation peak {_bytes(figures.activation_peak_bytes)}, "
        f"memory access {_bytes(figures.memory_bytes)}"
    )
    for note in figures.notes:
        lines.append(f"note    {note}")
    rows = [
        [_op_label(e), e["precision"], e["count"], _si(e["macs"]), _si(e["flops"]),
         _si(e["params"]), _bytes(e["memory_bytes"])]
        for e in figures.by_op_type()
    ]  # fmt: skip
    lines += ["", render_table(["op", "precision", "count", "MACs", "FLOPs", "params",
                                "memory access"], rows)]  # fmt: skip
    for line in predictions:
        lines.append(" ".join(line))
    return "\n".join(lines)


def _op_label(entry: dict[str, Any]) -> str:
    """An operator type as the table shows it: ONNX's depthwise ``Conv`` said so."""
    depthwise = entry["depthwise"] and "DEPTHWISE" not in entry["op_type"]
    return f"{entry['op_type']} (depthwise)" if depthwise else str(entry["op_type"])
