"""``edge-agent models inspect``: FLOPs, MACs and parameters of small graphs against
figures computed by hand, the activation peak, QDQ graphs, TFLite files, and the
roofline prediction of a profile."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_agent.profiles.cost import CostFigures, predict_ms
from edge_agent.toolchain.onnx_graph import FiguresError, onnx_figures
from edge_core.package import Cost
from edge_core.repository import ModelRepository


def model(nodes: list[Any], x: list[Any], y: list[Any], inits: dict[str, np.ndarray]) -> bytes:
    graph = helper.make_graph(
        nodes,
        "t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y)],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m.SerializeToString()


def conv(c_in: int, c_out: int, group: int, size: int = 16) -> bytes:
    w = np.ones((c_out, c_in // group, 3, 3))
    return model(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], group=group)],
        ["n", c_in, size, size],
        ["n", c_out, size, size],
        {"w": w, "b": np.zeros(c_out)},
    )


@pytest.mark.parametrize(
    ("c_in", "c_out", "group", "per_position"),
    [
        (3, 8, 1, 3 * 3 * 3 * 8),  # a plain convolution: k_h k_w c_in c_out
        (8, 8, 8, 3 * 3 * 8 * 8 // 8),  # depthwise: k_h k_w c_out
        (8, 16, 4, 3 * 3 * 8 * 16 // 4),  # grouped: k_h k_w c_in c_out / g
    ],
)
def test_convolution_macs_and_params_match_the_hand_count(
    c_in: int, c_out: int, group: int, per_position: int
) -> None:
    figures = onnx_figures(conv(c_in, c_out, group), batch=2)
    (op,) = figures.ops
    positions = 2 * 16 * 16  # batch x output height x width
    assert op.macs == per_position * positions
    assert op.flops == 2 * op.macs + 2 * c_out * 16 * 16  # + the bias
    assert figures.params == 3 * 3 * c_in * c_out // group + c_out
    assert figures.weight_bytes == 4 * figures.params
    assert figures.shapes == {"x": (2, c_in, 16, 16)}
    assert op.input_bytes == 4 * 2 * c_in * 16 * 16 and op.output_bytes == 4 * 2 * c_out * 256
    # only one input channel a group is depthwise: its operations have a rate of their own
    assert op.depthwise == (c_in == group)
    cost = figures.cost()
    assert (cost.depthwise, cost.flops) == (
        ({"fp32": op.flops}, {}) if c_in == group else ({}, {"fp32": op.flops})
    )


def test_gemm_and_matmul_and_the_activation_peak() -> None:
    data = model(
        [
            helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y"]),
        ],
        ["n", 64],
        ["n", 10],
        {"w1": np.ones((64, 32)), "b1": np.zeros(32), "w2": np.ones((32, 10))},
    )
    figures = onnx_figures(data, batch=4)
    gemm, relu, matmul = figures.ops
    assert gemm.macs == 4 * 64 * 32 and matmul.macs == 4 * 32 * 10
    assert relu.macs == 0 and relu.flops == 4 * 32
    assert figures.params == 64 * 32 + 32 + 32 * 10
    # at the Gemm: x (4x64) and h (4x32) alive; at the Relu: h and r; at the MatMul: r, y
    assert figures.activation_peak_bytes == 4 * 4 * (64 + 32)
    assert figures.cost() == Cost(
        flops={"fp32": gemm.flops + matmul.flops},
        elementwise={"fp32": relu.flops},  # at the element-wise rate, not the MAC peak
        memory_bytes=figures.memory_bytes,
        nodes=3,
        batch=4,
    )
    by_type = {e["op_type"]: e for e in figures.by_op_type()}
    assert by_type["Gemm"]["macs"] == 4 * 64 * 32


def test_a_dynamic_size_needs_a_shape() -> None:
    data = conv(3, 8, 1)
    graph_input = ["n", 3, "h", "w"]
    dynamic = model(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        graph_input,
        ["n", 8, "h", "w"],
        {"w": np.ones((8, 3, 3, 3))},
    )
    with pytest.raises(FiguresError, match="--shape x="):
        onnx_figures(dynamic)
    figures = onnx_figures(dynamic, shapes={"x": (1, 3, 32, 48)})
    assert figures.ops[0].macs == 32 * 48 * 3 * 3 * 3 * 8
    assert onnx_figures(data).batch == 1


def test_a_qdq_graph_counts_int8_compute_and_8_bit_tensors(repository: ModelRepository) -> None:
    package = repository.get("digits-heavy")
    fp32 = onnx_figures(package.read_variant(package.variant("onnx-fp32")))
    int8 = onnx_figures(package.read_variant(package.variant("onnx-int8")))
    assert int8.macs == fp32.macs  # the same convolutions, in INT8
    assert set(int8.cost().flops) >= {"int8"} and int8.cost().flops["int8"] > 0.99 * fp32.flops
    assert int8.memory_bytes < fp32.memory_bytes / 3  # 8-bit weights and activations
    assert int8.cost().nodes < len(int8.ops)  # Q/DQ nodes fold into the integer kernels


def test_roofline_prediction() -> None:
    figures = CostFigures(
        compute_gops={"fp32": 100.0, "int8": 400.0},
        bandwidth_gbs=10.0,
        call_overhead_us=10.0,
        node_overhead_us=1.0,
    )
    compute_bound = Cost(flops={"fp32": 10**9, "int8": 4 * 10**8}, memory_bytes=10**6, nodes=10)
    assert predict_ms(compute_bound, figures) == pytest.approx(0.010 + 0.010 + 10.0 + 1.0)
    memory_bound = Cost(flops={"fp16": 10**6}, memory_bytes=10**9, nodes=0)  # fp16: fp32 figure
    assert predict_ms(memory_bound, figures) == pytest.approx(0.010 + 100.0)
    assert predict_ms(memory_bound, figures, batch=2) == pytest.approx(0.010 + 200.0)
    slow = replace(figures, elementwise_gops={"fp32": 2.0})  # int8 falls back to it
    elementwise = Cost(flops={}, elementwise={"int8": 10**9}, memory_bytes=0, nodes=0)
    assert predict_ms(elementwise, slow) == pytest.approx(0.010 + 500.0)
    assert predict_ms(elementwise, figures) == pytest.approx(0.010 + 2.5)  # no rate: compute
    depthwise = Cost(flops={"int8": 4 * 10**8}, depthwise={"int8": 10**8}, memory_bytes=0, nodes=0)
    assert predict_ms(depthwise, figures) == pytest.approx(0.010 + 1.0 + 0.25)  # no rate: compute
    dw = replace(figures, depthwise_gops={"fp32": 20.0, "int8": 10.0})
    assert predict_ms(depthwise, dw) == pytest.approx(0.010 + 1.0 + 10.0)
    assert predict_ms(replace(depthwise, depthwise={"fp16": 10**8}), dw) == pytest.approx(
        0.010 + 1.0 + 5.0  # fp16: the FP32 figure
    )


@pytest.mark.slow
def test_inspect_command_on_a_file_and_a_tflite_package(fetched: ModelRepository) -> None:
    def inspect(*args: str) -> Any:
        done = subprocess.run(
            [sys.executable, "-m", "edge_agent", "models", "inspect", *args],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        return done.stdout

    ppocr = fetched.get("ppocr-det")
    path = str(ppocr.path_of(ppocr.variants[0]))
    data = json.loads(
        inspect(path, "--shape", "x=1,3,96,128", "--profile", "generic-x86_64", "--json")
    )
    assert data["shapes"] == {"x": [1, 3, 96, 128]} and data["opset"] == 12
    assert data["predicted_ms"]["generic-x86_64"] > 0
    assert {"Conv", "ConvTranspose"} <= {e["op_type"] for e in data["by_op_type"]}
    # PP-OCR's MobileNet blocks: their depthwise convolutions are a group of their own
    assert any(e["op_type"] == "Conv" and e["depthwise"] for e in data["by_op_type"])
    table = inspect(
        str(fetched.get("face-detection-short-range").root), "--profile", "raspberry-pi-5"
    )
    assert "DEPTHWISE_CONV_2D" in table and "predicted" in table and "30.8 MMAC" in table
    missing = subprocess.run(
        [sys.executable, "-m", "edge_agent", "models", "inspect", path],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert missing.returncode == 1 and "--shape x=" in missing.stderr


def test_tflite_depthwise_convolutions_have_their_own_rate(fetched: ModelRepository) -> None:
    from edge_agent.toolchain.tflite_graph import tflite_figures

    blazeface = fetched.get("face-detection-short-range")
    figures = tflite_figures(blazeface.read_variant(blazeface.variants[0]))
    depthwise = [op for op in figures.ops if op.op_type == "DEPTHWISE_CONV_2D"]
    assert depthwise and all(op.depthwise for op in depthwise)
    assert not any(op.depthwise for op in figures.ops if op.op_type == "CONV_2D")
    cost = figures.cost()
    assert sum(cost.depthwise.values()) == sum(op.flops for op in depthwise)


def test_the_agent_does_not_import_the_toolchain(tmp_path: Path) -> None:
    code = (
        "import sys, edge_agent.service.daemon, edge_agent.agent;"
        "print(any(m.startswith(('onnx.', 'edge_agent.toolchain')) or m == 'onnx'"
        " for m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
