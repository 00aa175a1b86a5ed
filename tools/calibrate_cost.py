"""Measure this machine's figures for a device profile's ``[cost]`` table.

The roofline of :mod:`edge_agent.profiles.cost` needs, per precision, the
operations a second the runtime reaches, the memory bandwidth it reaches, and
what a call and one operator cost on their own. This tool measures each on a
graph built for it with the ``onnx`` helpers, run by ONNX Runtime with the
profile's runtime options (threads not spinning, as ``models build``
measures)::

    python tools/calibrate_cost.py --profile generic-x86_64

- compute: four 3x3 convolutions, 64 -> 64 channels on 56x56 (0.93 GFLOP), in
  FP32, in FP16 (as ONNX Runtime runs FP16 on this CPU) and in INT8 (QDQ);
- depthwise rate: eight depthwise 3x3 convolutions, 96 channels on 80x80, in FP32
  and in INT8 (QDQ);
- element-wise rate: 20 additions and multiplications by per-channel constants on a
  [1, 32, 64, 64] tensor, in FP32 and in INT8 (QDQ: ONNX Runtime's QLinearAdd/Mul);
- bandwidth: an ``Add`` of two 1M-element FP32 tensors (4 MB each, the size of
  the activations of the image models here: what they read and write mostly
  comes from the caches, not from DRAM);
- call overhead: an ``Add`` of two scalars; node overhead: a chain of 200
  ``Relu`` on 16 values, less one call.

It prints the ``[cost]`` table to paste into the profile.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge_agent.profiles import ProfileStore
from edge_core.paths import default_profiles_dir
from edge_core.runtime import RuntimeOptions, open_model

Array = np.ndarray[Any, Any]


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any]) -> bytes:
    from onnx import helper

    graph = helper.make_graph(nodes, "calibration", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return bytes(model.SerializeToString())


def _one_tensor(nodes: list[Any], inits: list[Any], shape: list[int]) -> bytes:
    """A model of ``nodes`` from an FP32 ``x`` to a ``y`` of the same ``shape``."""
    from onnx import TensorProto, helper

    spec = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "xy"]
    return _model(nodes, spec[:1], spec[1:], inits)


def conv_chain(
    length: int, channels: int, side: int, *, group: int = 1, spread: float = 0.05
) -> tuple[bytes, dict[str, Array], int]:
    """``length`` 3x3 convolutions of ``channels`` channels on ``side`` x ``side``, then a
    ``Relu``; ``group``: the channels' groups (``channels``: depthwise)."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(length):
        w = rng.normal(0, spread, (channels, channels // group, 3, 3)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(
            helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1], group=group)
        )
        x = f"c{i}"
    nodes.append(helper.make_node("Relu", [x], ["y"]))
    shape = [1, channels, side, side]
    flops = length * 2 * side * side * channels * (channels // group) * 9
    return (
        _one_tensor(nodes, inits, shape),
        {"x": rng.normal(0, 1, shape).astype(np.float32)},
        flops,
    )


def conv_model() -> tuple[bytes, dict[str, Array], int]:
    """Four dense 3x3 convolutions, 64 channels on 56x56 (0.93 GFLOP)."""
    return conv_chain(4, 64, 56)


def depthwise_model() -> tuple[bytes, dict[str, Array], int]:
    """Eight depthwise 3x3 convolutions, 96 channels on 80x80 (2.4 MB: the size of a
    MobileNet block's activations at 640x480)."""
    return conv_chain(8, 96, 80, group=96, spread=0.3)


def elementwise_chain(length: int = 20) -> tuple[bytes, dict[str, Array], int]:
    """Additions and multiplications by a per-channel constant, alternating, on a
    [1, 32, 64, 64] tensor (512 KB: in the caches), as squeeze-excitation scales and
    h-swish's arithmetic are."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(length):
        value = rng.uniform(0.5, 1.5, (1, 32, 1, 1)).astype(np.float32)
        inits.append(numpy_helper.from_array(value, f"c{i}"))
        nodes.append(helper.make_node("Mul" if i % 2 else "Add", [x, f"c{i}"], [f"t{i}"]))
        x = f"t{i}"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    shape = [1, 32, 64, 64]
    feeds = {"x": rng.uniform(0, 1, shape).astype(np.float32)}
    return _one_tensor(nodes, inits, shape), feeds, length * 32 * 64 * 64


def add_model(elements: int) -> tuple[bytes, dict[str, Array]]:
    from onnx import TensorProto, helper

    spec = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [elements]) for n in "ab"]
    data = _model(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        spec,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [elements])],
        [],
    )
    feeds = {n: np.ones(elements, np.float32) for n in "ab"}
    return data, feeds


def relu_chain(length: int) -> tuple[bytes, dict[str, Array]]:
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(length)]
    data = _model(
        nodes,
        [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [16])],
        [helper.make_tensor_value_info(f"t{length}", TensorProto.FLOAT, [16])],
        [],
    )
    return data, {"t0": np.ones(16, np.float32)}


def seconds(call: Callable[[], Any], budget: float = 1.0) -> float:
    """The median time of one call, over about ``budget`` seconds."""
    call()
    times: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < budget or len(times) < 5:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="generic-x86_64")
    args = parser.parse_args(argv)
    from edge_agent.toolchain import convert

    profile = ProfileStore(default_profiles_dir()).get(args.profile)
    options: RuntimeOptions = replace(profile.runtime, allow_spinning=False)

    def timed(data: bytes, feeds: dict[str, Array]) -> float:
        session = open_model("onnx", data, options)
        return seconds(session.raw_call(feeds))

    conv, feeds, flops = conv_model()
    fp16, _, _ = convert.fp16(conv, [feeds])
    int8 = convert.int8_static(conv, [feeds], method="MinMax", per_channel=True)
    gops = {
        "fp32": flops / timed(conv, feeds) / 1e9,
        "fp16": flops / timed(fp16, feeds) / 1e9,
        "int8": flops / timed(int8, feeds) / 1e9,
    }
    depthwise, dw_feeds, dw_flops = depthwise_model()
    depthwise8 = convert.int8_static(depthwise, [dw_feeds], method="MinMax", per_channel=True)
    depthwise_gops = {
        "fp32": dw_flops / timed(depthwise, dw_feeds) / 1e9,
        "int8": dw_flops / timed(depthwise8, dw_feeds) / 1e9,
    }
    chain, chain_feeds, elements = elementwise_chain()
    chain8 = convert.int8_static(chain, [chain_feeds], method="MinMax", per_channel=True)
    elementwise = {
        "fp32": elements / timed(chain, chain_feeds) / 1e9,
        "int8": elements / timed(chain8, chain_feeds) / 1e9,
    }
    add, add_feeds = add_model(1 << 20)
    bandwidth = 3 * 4 * (1 << 20) / timed(add, add_feeds) / 1e9
    tiny, tiny_feeds = add_model(1)
    call_us = timed(tiny, tiny_feeds) * 1e6
    relus, relu_feeds = relu_chain(200)
    node_us = max(0.0, (timed(relus, relu_feeds) * 1e6 - call_us) / 200)
    figures = ", ".join(f"{p} = {v:.0f}" for p, v in gops.items())
    print("[cost]")
    print(f'source = "measured here by tools/calibrate_cost.py ({profile.id} runtime options)"')
    print(f"compute_gops = {{ {figures} }}")
    rates = ", ".join(f"{p} = {v:.1f}" for p, v in elementwise.items())
    print(f"elementwise_gops = {{ {rates} }}")
    rates = ", ".join(f"{p} = {v:.1f}" for p, v in depthwise_gops.items())
    print(f"depthwise_gops = {{ {rates} }}")
    print(f"bandwidth_gbs = {bandwidth:.1f}")
    print("efficiency = 1.0")
    print(f"call_overhead_us = {call_us:.1f}")
    print(f"node_overhead_us = {node_us:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
