from __future__ import annotations

import numpy as np
import pytest

from edge_agent.errors import InputError
from edge_agent.tensors import TensorSpec, datatype_of, format_shape, numpy_dtype, validate_inputs

SPECS = (TensorSpec("pixels", "FP32", (-1, 64)), TensorSpec("mask", "UINT8", (-1, 4)))


def good() -> dict[str, np.ndarray]:
    return {"pixels": np.zeros((2, 64), np.float32), "mask": np.zeros((2, 4), np.uint8)}


def test_valid_inputs_pass_through_unchanged() -> None:
    inputs = good()
    checked = validate_inputs(SPECS, inputs)
    assert checked["pixels"] is inputs["pixels"]
    assert checked["mask"] is inputs["mask"]


def test_dynamic_dimension_takes_any_size() -> None:
    inputs = {"pixels": np.zeros((17, 64), np.float32), "mask": np.zeros((17, 4), np.uint8)}
    assert validate_inputs(SPECS, inputs)["pixels"].shape == (17, 64)


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [(np.float64, np.float32), (np.int64, np.float32), (np.uint8, np.float32)],
)
def test_safe_casts_are_applied(dtype: type, expected: type) -> None:
    inputs = good()
    inputs["pixels"] = np.ones((2, 64), dtype)
    checked = validate_inputs(SPECS, inputs)
    assert checked["pixels"].dtype == expected
    assert np.all(checked["pixels"] == 1)


def test_lists_are_accepted() -> None:
    inputs = {"pixels": [[0.5] * 64], "mask": np.zeros((1, 4), np.uint8)}
    assert validate_inputs(SPECS, inputs)["pixels"].dtype == np.float32


def test_unknown_input_is_named() -> None:
    inputs = {**good(), "extra": np.zeros(1)}
    with pytest.raises(
        InputError, match=r"unknown input 'extra'; the model takes 'pixels', 'mask'"
    ) as info:
        validate_inputs(SPECS, inputs)
    assert info.value.input_name == "extra"


def test_missing_input_is_named() -> None:
    with pytest.raises(InputError, match="missing input 'mask'"):
        validate_inputs(SPECS, {"pixels": np.zeros((1, 64), np.float32)})


def test_wrong_rank_says_what_came_and_what_was_expected() -> None:
    inputs = good()
    inputs["pixels"] = np.zeros(64, np.float32)
    with pytest.raises(
        InputError, match=r"input 'pixels': wrong rank: got shape \[64\], expected \[\?, 64\]"
    ):
        validate_inputs(SPECS, inputs)


def test_wrong_shape_says_what_came_and_what_was_expected() -> None:
    inputs = good()
    inputs["pixels"] = np.zeros((2, 63), np.float32)
    with pytest.raises(
        InputError, match=r"input 'pixels': wrong shape: got shape \[2, 63\], expected \[\?, 64\]"
    ):
        validate_inputs(SPECS, inputs)


@pytest.mark.parametrize(
    ("value", "described"),
    [
        (np.zeros((2, 4), np.float32), "FP32"),  # float -> integer loses the fraction
        (np.zeros((2, 4), np.int8), "INT8"),  # signed -> unsigned
        (np.full((2, 4), "a"), "BYTES"),
    ],
)
def test_unsafe_casts_are_refused(value: np.ndarray, described: str) -> None:
    inputs = good()
    inputs["mask"] = value
    with pytest.raises(
        InputError,
        match=rf"input 'mask': datatype {described} cannot be converted safely to the expected UINT8",
    ):
        validate_inputs(SPECS, inputs)


def test_datatype_names_round_trip() -> None:
    for name in ("FP32", "FP16", "INT8", "UINT8", "INT64", "BOOL"):
        assert datatype_of(numpy_dtype(name)) == name
    with pytest.raises(ValueError, match="unknown datatype 'FLOAT'"):
        numpy_dtype("FLOAT")
    assert format_shape((-1, 3)) == "[?, 3]"
