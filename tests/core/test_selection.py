from __future__ import annotations

import pytest

from edge_core.errors import NoVariantError
from edge_core.repository import ModelRepository
from edge_core.runtime import installed_formats, rank_variants


def ids(variants) -> list[str]:  # type: ignore[no-untyped-def]
    return [v.id for v in variants]


def test_precision_first_then_format(repository: ModelRepository) -> None:
    package = repository.get("digits-light")
    ranked = rank_variants(
        package,
        precisions=("int8", "fp32"),
        formats=("tflite", "onnx"),
        installed={"onnx", "tflite"},
    )
    assert ids(ranked) == ["tflite-int8", "onnx-int8", "tflite-fp32", "onnx-fp32", "onnx-fp16"]


def test_jetson_order_prefers_fp16_onnx(repository: ModelRepository) -> None:
    package = repository.get("digits-light")
    ranked = rank_variants(
        package,
        precisions=("fp16", "int8", "fp32"),
        formats=("onnx", "tflite"),
        installed={"onnx", "tflite"},
    )
    assert ids(ranked)[:3] == ["onnx-fp16", "onnx-int8", "tflite-int8"]


def test_missing_runtime_removes_its_variants(repository: ModelRepository) -> None:
    package = repository.get("digits-light")
    ranked = rank_variants(
        package, precisions=("int8", "fp32"), formats=("tflite", "onnx"), installed={"onnx"}
    )
    assert ids(ranked) == ["onnx-int8", "onnx-fp32", "onnx-fp16"]


def test_unlisted_precisions_come_last(repository: ModelRepository) -> None:
    package = repository.get("digits-light")
    ranked = rank_variants(
        package, precisions=("int8",), formats=("onnx",), installed={"onnx", "tflite"}
    )
    assert ids(ranked) == ["onnx-int8", "tflite-int8", "onnx-fp32", "tflite-fp32", "onnx-fp16"]


def test_nothing_runnable_explains_why(repository: ModelRepository) -> None:
    package = repository.get("digits-heavy")
    with pytest.raises(NoVariantError) as info:
        rank_variants(
            package,
            precisions=("int8",),
            formats=("onnx",),
            installed={"tflite"},
            profile_name="profile imx8mp",
        )
    message = str(info.value)
    assert "it offers onnx-fp32, onnx-int8" in message
    assert "runtimes installed for formats: tflite" in message
    assert "profile imx8mp prefers int8 in onnx" in message


def test_both_runtimes_are_installed_here() -> None:
    assert installed_formats() == {"onnx", "tflite"}
