"""A roofline latency estimate: a variant's cost (:class:`edge_core.package.Cost`)
on a device profile's compute and memory figures.

Pure arithmetic on values, so the agent can use it for the latency prior of a
variant it has not timed yet (no ``onnx``, no model opened)::

    time = call overhead + nodes x node overhead
         + max(sum over precisions of (multiply-accumulate operations / compute
                                       + depthwise convolutions' / depthwise rate
                                       + other operations / element-wise rate)
                 / efficiency,
               bytes moved / (bandwidth x efficiency))

Element-wise operators (activations, additions, scalings) run far below a
CPU's multiply-accumulate peak, and their 8-bit versions no faster than the
float ones (each element is requantized): they have a rate of their own
(``elementwise_gops``; the compute figure where a profile gives none). So do
depthwise convolutions (one input channel a group, as in MobileNet's blocks):
a few multiply-accumulates per value read, which vector units cannot fill, and
slower in 8 bits (``depthwise_gops``; measured here at about 0.3 of the dense
convolutions' rate in FP32 and 0.05 in INT8; the compute figure where a profile
gives none).

A profile's figures are the vendor's peak figures with the share of them the
runtime reaches (``efficiency``), or, for a profile calibrated by measurement
(``generic-x86_64``: ``tools/calibrate_cost.py``), measured figures with
``efficiency = 1``. A precision the profile gives no figure for runs at the
FP32 figure (a CPU without FP16 arithmetic converts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edge_core.package import Cost

__all__ = ["CostFigures", "predict_ms"]


@dataclass(frozen=True)
class CostFigures:
    """A profile's ``[cost]`` table.

    Attributes:
        compute_gops: billions of operations a second per precision of the
            multiply-accumulating operators (a multiply-accumulate is two);
            ``fp32`` is required.
        elementwise_gops: billions of operations a second per precision of the
            other operators (one an element); a precision without one takes the
            ``fp32`` figure, a profile without any its ``compute_gops``.
        depthwise_gops: the same for depthwise convolutions (a multiply-accumulate
            is two), with the same fallbacks.
        bandwidth_gbs: memory bandwidth, GB/s.
        efficiency: the share of those figures the runtime's kernels reach
            (1.0 for measured figures).
        call_overhead_us: the fixed cost of one call (runtime entry, threads).
        node_overhead_us: the cost of dispatching one operator.
        source: where the figures come from (a vendor's document, a measurement).
    """

    compute_gops: Mapping[str, float]
    bandwidth_gbs: float
    elementwise_gops: Mapping[str, float] = field(default_factory=dict)
    depthwise_gops: Mapping[str, float] = field(default_factory=dict)
    efficiency: float = 1.0
    call_overhead_us: float = 0.0
    node_overhead_us: float = 0.0
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def gops(self, precision: str) -> float:
        return self.compute_gops.get(precision, self.compute_gops["fp32"])

    def elementwise_rate(self, precision: str) -> float:
        return self._rate(self.elementwise_gops, precision)

    def depthwise_rate(self, precision: str) -> float:
        return self._rate(self.depthwise_gops, precision)

    def _rate(self, rates: Mapping[str, float], precision: str) -> float:
        """``rates``' figure for ``precision``: its FP32 one when it has none, the
        compute figure when ``rates`` is empty."""
        if not rates:
            return self.gops(precision)
        return rates.get(precision, rates["fp32"])

    def to_dict(self) -> dict[str, Any]:
        return {
            "compute_gops": dict(self.compute_gops),
            "elementwise_gops": dict(self.elementwise_gops),
            "depthwise_gops": dict(self.depthwise_gops),
            "bandwidth_gbs": self.bandwidth_gbs,
            "efficiency": self.efficiency,
            "call_overhead_us": self.call_overhead_us,
            "node_overhead_us": self.node_overhead_us,
            "source": self.source,
        }


def predict_ms(cost: Cost, figures: CostFigures, batch: int | None = None) -> float:
    """The roofline estimate of one run of ``cost`` (scaled to ``batch`` items when
    given: operations and bytes grow with the batch, the overheads do not)."""
    scale = (batch / cost.batch) if batch else 1.0
    rate = 1e9 * figures.efficiency
    compute_s = sum(
        scale * ops / (rate_of(precision) * rate)
        for operations, rate_of in (
            (cost.flops, figures.gops),
            (cost.elementwise, figures.elementwise_rate),
            (cost.depthwise, figures.depthwise_rate),
        )
        for precision, ops in operations.items()
    )
    memory_s = scale * cost.memory_bytes / (figures.bandwidth_gbs * 1e9 * figures.efficiency)
    overhead_s = (figures.call_overhead_us + cost.nodes * figures.node_overhead_us) / 1e6
    return 1000.0 * (overhead_s + max(compute_s, memory_s))
