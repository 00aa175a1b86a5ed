from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest

from edge_core.errors import (
    ConfigError,
    InferenceError,
    InputError,
    ModelLoadError,
    NoVariantError,
    PackageError,
)
from edge_core.package import ModelPackage, Variant
from edge_core.repository import ModelRepository
from edge_core.runtime import (
    DelegateSpec,
    RuntimeOptions,
    Session,
    open_best,
    open_model,
    open_variant,
)
from edge_core.runtime.onnx import choose_providers
from edge_core.tensors import TensorSpec

OPTIONS = RuntimeOptions(threads=1, warmup=1)
COMMITTED = [
    ("digits-light", "onnx-fp32"),
    ("digits-light", "onnx-fp16"),
    ("digits-light", "onnx-int8"),
    ("digits-light", "tflite-fp32"),
    ("digits-light", "tflite-int8"),
    ("digits-heavy", "onnx-fp32"),
    ("digits-heavy", "onnx-int8"),
]


@pytest.mark.parametrize(("model", "variant_id"), COMMITTED)
def test_each_variant_matches_its_golden_outputs(
    repository: ModelRepository, model: str, variant_id: str
) -> None:
    package = repository.get(model)
    variant = package.variant(variant_id)
    session = open_variant(package, variant, OPTIONS)
    golden = package.golden()
    outputs = session.run(golden.inputs)
    assert outputs["probabilities"].dtype == np.float32
    assert variant.tolerance.allclose(outputs["probabilities"], golden.outputs["probabilities"])
    # the same labels as the FP32 reference on every golden input
    assert np.array_equal(
        outputs["probabilities"].argmax(axis=1), golden.outputs["probabilities"].argmax(axis=1)
    )


@pytest.mark.slow
@pytest.mark.parametrize(("model", "variant_id"), COMMITTED)
def test_each_variant_reaches_its_recorded_accuracy(
    repository: ModelRepository, model: str, variant_id: str
) -> None:
    package = repository.get(model)
    variant = package.variant(variant_id)
    session = open_variant(package, variant, OPTIONS)
    inputs, labels = package.evaluation()
    scores = session.run({"pixels": inputs})["probabilities"]
    accuracy = float(np.mean(scores.argmax(axis=1) == labels))
    assert variant.accuracy is not None
    assert abs(accuracy - variant.accuracy) <= 0.003  # one sample in 360


def test_int8_tflite_takes_and_gives_floats(repository: ModelRepository) -> None:
    package = repository.get("digits-light")
    session = open_variant(package, package.variant("tflite-int8"), OPTIONS)
    spec = session.inputs[0]
    assert spec.datatype == "FP32" and spec.storage_datatype == "INT8"
    assert spec.quantization is not None and spec.quantization.scale > 0
    out = session.outputs[0]
    assert out.datatype == "FP32" and out.storage_datatype == "INT8"
    probabilities = session.run(package.golden().inputs)["probabilities"]
    assert probabilities.dtype == np.float32
    assert np.allclose(probabilities.sum(axis=1), 1.0, atol=0.05)


@pytest.mark.parametrize("variant_id", ["tflite-int8", "onnx-int8"])
def test_any_batch_size_runs(repository: ModelRepository, variant_id: str) -> None:
    package = repository.get("digits-light")
    session = open_variant(package, package.variant(variant_id), OPTIONS)
    inputs, _ = package.evaluation()
    single = np.concatenate(
        [session.run({"pixels": inputs[i : i + 1]})["probabilities"] for i in range(7)]
    )
    batch = session.run({"pixels": inputs[:7]})["probabilities"]
    assert batch.shape == (7, 10)
    assert np.allclose(batch, single, atol=1e-6)
    assert session.run({"pixels": inputs[:1]})["probabilities"].shape == (1, 10)


@pytest.mark.parametrize("variant_id", ["onnx-fp32", "tflite-fp32"])
def test_loading_from_bytes_and_from_path_agree(
    repository: ModelRepository, variant_id: str
) -> None:
    package = repository.get("digits-light")
    variant = package.variant(variant_id)
    from_bytes = open_model(variant.format, package.read_variant(variant), OPTIONS)
    from_path = open_model(variant.format, str(package.path_of(variant)), OPTIONS)
    golden = package.golden().inputs
    assert np.array_equal(
        from_bytes.run(golden)["probabilities"], from_path.run(golden)["probabilities"]
    )


@pytest.mark.parametrize("variant_id", ["onnx-fp32", "tflite-int8"])
def test_validation_happens_before_the_runtime(
    repository: ModelRepository, variant_id: str
) -> None:
    package = repository.get("digits-light")
    session = open_variant(package, package.variant(variant_id), OPTIONS)
    with pytest.raises(
        InputError, match=r"input 'pixels': wrong shape: got shape \[1, 65\], expected \[\?, 64\]"
    ):
        session.run({"pixels": np.zeros((1, 65), np.float32)})
    with pytest.raises(InputError, match="unknown input 'image'; the model takes 'pixels'"):
        session.run({"image": np.zeros((1, 64), np.float32)})
    with pytest.raises(InputError, match="missing input 'pixels'"):
        session.run({})
    with pytest.raises(
        InputError, match="datatype BYTES cannot be converted safely to the expected FP32"
    ):
        session.run({"pixels": np.array([["x"] * 64], dtype=object)})


@pytest.mark.parametrize("fmt", ["onnx", "tflite"])
def test_garbage_model_is_a_load_error(fmt: str) -> None:
    with pytest.raises(ModelLoadError, match="cannot load the model"):
        open_model(fmt, b"this is not a model" * 10)


def test_runtime_failure_is_translated() -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    # Reshape to a fixed [2, 2]: only inputs of exactly 4 values can run.
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
        [numpy_helper.from_array(np.array([2, 2], dtype=np.int64), "shape")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    session = open_model("onnx", model.SerializeToString(), OPTIONS)
    assert session.run({"x": np.arange(4, dtype=np.float32)})["y"].shape == (2, 2)
    with pytest.raises(InferenceError, match="ONNX Runtime failed"):
        session.run({"x": np.arange(5, dtype=np.float32)})
    assert onnx is not None


def test_missing_execution_provider_falls_back_with_a_warning(
    repository: ModelRepository, caplog: pytest.LogCaptureFixture
) -> None:
    package = repository.get("digits-light")
    options = replace(
        OPTIONS,
        providers=("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
    )
    # logged as a warning once a process, then at debug level (an earlier test may
    # have had it first)
    with caplog.at_level(logging.DEBUG, logger="edge_core.runtime.onnx"):
        session = open_variant(package, package.variant("onnx-fp32"), options)
    assert session.device == "CPUExecutionProvider"
    assert any("TensorrtExecutionProvider is not available" in w for w in session.warnings)
    assert any("CUDAExecutionProvider is not available" in r.message for r in caplog.records)
    golden = package.golden()
    assert package.variant("onnx-fp32").tolerance.allclose(
        session.run(golden.inputs)["probabilities"], golden.outputs["probabilities"]
    )


def test_provider_choice_keeps_order_and_always_ends_with_cpu() -> None:
    chosen, warnings = choose_providers(
        ("TensorrtExecutionProvider", "CUDAExecutionProvider"),
        ["CUDAExecutionProvider", "CPUExecutionProvider"],
    )
    assert chosen == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert len(warnings) == 1 and "TensorrtExecutionProvider" in warnings[0]


@pytest.mark.parametrize(
    ("library", "reason"),
    [
        ("/nonexistent/libvx_delegate.so", "cannot be loaded"),
        ("libm.so.6", "is not a TFLite external delegate"),
    ],
)
def test_unusable_delegate_falls_back_to_cpu(
    repository: ModelRepository, library: str, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    package = repository.get("digits-light")
    options = replace(OPTIONS, delegates=(DelegateSpec(library),))
    with caplog.at_level(logging.WARNING):
        session = open_variant(package, package.variant("tflite-int8"), options)
    assert session.device == "xnnpack"
    assert any(library in w and reason in w for w in session.warnings)
    assert any(reason in r.message for r in caplog.records)
    golden = package.golden()
    assert package.variant("tflite-int8").tolerance.allclose(
        session.run(golden.inputs)["probabilities"], golden.outputs["probabilities"]
    )


def test_manifest_that_disagrees_with_the_model_is_refused(repository: ModelRepository) -> None:
    package = repository.get("digits-light")
    wrong = replace(package, inputs=(TensorSpec("pixels", "FP32", (-1, 32)),))
    with pytest.raises(
        PackageError,
        match=r"input 'pixels' is FP32 \[\?, 32\] in the manifest but FP32 \[\?, 64\] in the model",
    ):
        open_variant(wrong, wrong.variant("onnx-fp32"), OPTIONS)
    renamed = replace(package, outputs=(TensorSpec("scores", "FP32", (-1, 10)),))
    with pytest.raises(
        PackageError,
        match=r"the manifest's outputs \(scores\) do not match the model's \(probabilities\)",
    ):
        open_variant(renamed, renamed.variant("tflite-fp32"), OPTIONS)


class CountingSession(Session):
    """A fake at our own seam: counts the runs that reach the backend."""

    backend = "counting"

    def __init__(self) -> None:
        super().__init__(
            (TensorSpec("x", "FP32", (-1, 3)),), (TensorSpec("y", "FP32", (-1, 3)),), device="fake"
        )
        self.calls: list[tuple[int, ...]] = []

    def _run(self, feeds):  # type: ignore[no-untyped-def]
        self.calls.append(feeds["x"].shape)
        return {"y": feeds["x"]}

    def raw_call(self, inputs):  # type: ignore[no-untyped-def]
        return lambda: None


def test_warm_up_runs_the_model_on_zeros() -> None:
    session = CountingSession()
    session.warm_up(4)
    assert session.calls == [(1, 3)] * 4
    session.warm_up(0)
    assert len(session.calls) == 4


def test_open_best_follows_preferences(repository: ModelRepository) -> None:
    package = repository.get("digits-light")
    variant, session = open_best(
        package, OPTIONS, precisions=("int8", "fp32"), formats=("tflite", "onnx")
    )
    assert variant.id == "tflite-int8" and session.backend == "litert"
    variant, session = open_best(package, OPTIONS, precisions=("fp16",), formats=("onnx",))
    assert variant.id == "onnx-fp16" and session.backend == "onnxruntime"


def test_open_best_falls_back_when_a_variant_cannot_load(
    repository: ModelRepository, caplog: pytest.LogCaptureFixture
) -> None:
    package = repository.get("digits-light")
    broken = Variant(
        id="tflite-int8",
        format="tflite",
        precision="int8",
        file="model.int8.tflite",
        sha256="0" * 64,
        size=1,
    )
    others = tuple(v for v in package.variants if v.id != "tflite-int8")
    damaged = ModelPackage(**{**vars(package), "variants": (broken, *others)})
    with caplog.at_level(logging.WARNING):
        variant, _ = open_best(
            damaged, OPTIONS, precisions=("int8", "fp32"), formats=("tflite", "onnx")
        )
    assert variant.id == "onnx-int8"
    assert any("cannot open digits-light:1 tflite-int8" in r.message for r in caplog.records)
    only_broken = ModelPackage(**{**vars(package), "variants": (broken,)})
    with pytest.raises(NoVariantError, match="could be loaded: tflite-int8"):
        open_best(only_broken, OPTIONS, precisions=("int8",), formats=("tflite",))


def test_an_unknown_graph_optimization_level_is_a_config_error() -> None:
    with pytest.raises(
        ConfigError,
        match=r"RuntimeOptions.graph_optimization: expected one of 'disable', 'basic', "
        r"'extended', 'all', got 'max'",
    ):
        RuntimeOptions(graph_optimization="max")
    assert RuntimeOptions(graph_optimization="basic").graph_optimization == "basic"
