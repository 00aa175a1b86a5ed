from __future__ import annotations

import numpy as np
import pytest

from edge_core.errors import InputError
from edge_core.tensors import TensorSpec, datatype_of, format_shape, numpy_dtype, validate_inputs

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


INT8 = (TensorSpec("codes", "INT8", (-1,)),)
FP16 = (TensorSpec("x", "FP16", (-1,)),)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        # NumPy's same_kind would wrap these to [44, 24] and accept any uint64
        (
            np.array([300, -1000], np.int64),
            r"input 'codes': datatype INT64 cannot be converted safely to the expected INT8$",
        ),
        (
            np.array([1, 2], np.uint64),
            r"input 'codes': datatype UINT64 cannot be converted safely to the expected INT8$",
        ),
        (
            [300, -1000],
            r"input 'codes': datatype INT64 cannot be converted safely to the expected INT8: "
            r"values from -1000 to 300 do not fit INT8 \(-128 to 127\)",
        ),
        ([1.5, 2.0], r"datatype FP64 cannot be converted safely to the expected INT8"),
    ],
)
def test_integers_that_would_wrap_are_refused(value: object, message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        validate_inputs(INT8, {"codes": value})
    assert info.value.input_name == "codes"


def test_python_integers_that_fit_are_accepted() -> None:
    """JSON gives Python ints (int64 to NumPy): accepted where every value fits."""
    checked = validate_inputs(INT8, {"codes": [-128, 0, 127]})["codes"]
    assert checked.dtype == np.int8
    assert checked.tolist() == [-128, 0, 127]


def test_a_narrower_int_array_is_widened() -> None:
    specs = (TensorSpec("c", "INT32", (-1,)),)
    checked = validate_inputs(specs, {"c": np.array([-5], np.int8)})
    assert checked["c"].dtype == np.int32 and checked["c"].tolist() == [-5]


def test_float64_into_fp16_must_stay_in_range() -> None:
    checked = validate_inputs(FP16, {"x": np.array([0.5, -60000.0])})["x"]
    assert checked.dtype == np.float16
    assert checked.tolist() == [0.5, -60000.0]
    with pytest.raises(
        InputError,
        match=r"input 'x': datatype FP64 cannot be converted safely to the expected FP16: "
        r"a value of magnitude 1e\+10 is beyond FP16's range \(±65504\)",
    ):
        validate_inputs(FP16, {"x": np.array([1.0, 1e10])})
    # nan and inf are converted as they are: only a finite value may not overflow
    kept = validate_inputs(FP16, {"x": [1.0, float("nan"), float("-inf")]})["x"]
    assert kept[0] == 1.0 and np.isnan(kept[1]) and kept[2] == -np.inf
    with pytest.raises(InputError, match=r"input 'x': .* beyond FP16's range"):
        validate_inputs(FP16, {"x": [float("nan"), 1e6]})


def test_float64_into_fp32_rounds_but_refuses_overflow() -> None:
    checked = validate_inputs(SPECS, {**good(), "pixels": np.full((1, 64), 0.1)})["pixels"]
    assert checked.dtype == np.float32 and checked[0, 0] == np.float32(0.1)
    with pytest.raises(InputError, match=r"input 'pixels': .* beyond FP32's range"):
        validate_inputs(SPECS, {**good(), "pixels": np.full((1, 64), 1e300)})


def test_integers_into_a_float_input_must_be_exact() -> None:
    checked = validate_inputs(SPECS, {**good(), "pixels": [list(range(64))]})["pixels"]
    assert checked.dtype == np.float32 and checked[0, 63] == 63.0
    with pytest.raises(
        InputError,
        match=r"input 'pixels': datatype INT64 cannot be converted safely to the expected FP32: "
        r"a value is too large to be represented exactly in FP32",
    ):
        validate_inputs(SPECS, {**good(), "pixels": np.full((1, 64), 2**24 + 1, np.int64)})
    with pytest.raises(InputError, match=r"too large to be represented exactly in FP32"):
        validate_inputs(SPECS, {**good(), "pixels": np.full((1, 64), 2**63 - 1, np.int64)})


def test_a_ragged_list_is_an_input_error() -> None:
    with pytest.raises(
        InputError,
        match=r"input 'codes': not a regular array \(rows of different lengths\?\); "
        r"expected INT8 values of shape \[\?\]",
    ) as info:
        validate_inputs(INT8, {"codes": [[1, 2], [3]]})
    assert info.value.input_name == "codes"
