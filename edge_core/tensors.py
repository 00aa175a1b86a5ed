"""Tensor descriptions and input validation, shared by the device and the gateway.

Datatypes are named as the Open Inference Protocol names them (``FP32``,
``INT8``, ...), everywhere: in manifests, in the runtime layer and on the
wire. A dimension of ``-1`` is dynamic.

Validation happens before any runtime sees the data, and every refusal names
the input, what came and what was expected. A dtype is accepted when NumPy
can cast it to the expected one without losing anything (NumPy's ``safe``
rule: ``uint8`` to ``float32``, ``int8`` to ``int32``), and in three cases a
user expects, decided by the values themselves:

- floats to a narrower float (``float64`` to ``FP32``/``FP16``) when every
  finite value is within the target's range (rounding is expected, a finite
  value turned ``inf`` is not; ``nan`` and ``inf`` stay what they are);
- integers to a float input when every value is represented exactly;
- Python integers (lists and scalars, as JSON gives them) to an integer input
  when every value fits the target's range.

Everything else is refused: floats to integers, ``int64``/``uint64`` arrays to
a narrower integer, signed to unsigned, strings, ragged lists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_core.errors import InputError

__all__ = [
    "DATATYPES",
    "TensorSpec",
    "check_rows",
    "convert_input",
    "datatype_of",
    "format_shape",
    "numpy_dtype",
    "validate_inputs",
]

#: Open Inference Protocol datatype name -> NumPy dtype.
DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
_NAMES: dict[np.dtype[Any], str] = {dtype: name for name, dtype in DATATYPES.items()}


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    """The NumPy dtype of an Open Inference Protocol datatype name.

    Raises:
        ValueError: ``datatype`` is not a known name.
    """
    try:
        return DATATYPES[datatype]
    except KeyError:
        known = ", ".join(DATATYPES)
        raise ValueError(f"unknown datatype {datatype!r}; expected one of {known}") from None


def datatype_of(dtype: npt.DTypeLike) -> str:
    """The Open Inference Protocol datatype name of a NumPy dtype.

    Raises:
        ValueError: the dtype has no protocol name.
    """
    resolved = np.dtype(dtype)
    if resolved.kind in "SU":
        return "BYTES"
    try:
        return _NAMES[resolved]
    except KeyError:
        raise ValueError(f"dtype {resolved} has no Open Inference Protocol datatype") from None


def format_shape(shape: Sequence[int]) -> str:
    """``[-1, 64]`` -> ``'[?, 64]'``, for messages."""
    return "[" + ", ".join("?" if d < 0 else str(d) for d in shape) + "]"


@dataclass(frozen=True)
class Quantization:
    """Affine quantization of an integer tensor: ``real = (q - zero_point) * scale``."""

    scale: float
    zero_point: int


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model.

    ``datatype`` is what callers pass or receive. For a quantized tensor
    (``quantization`` set), the runtime holds ``storage_datatype`` integers and
    converts; callers still see ``datatype`` (``FP32``).
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    quantization: Quantization | None = None
    storage_datatype: str | None = None
    _dtype: np.dtype[Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_dtype", numpy_dtype(self.datatype))
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    def accepts_shape(self, shape: Sequence[int]) -> bool:
        return len(shape) == len(self.shape) and all(
            want < 0 or want == got for want, got in zip(self.shape, shape, strict=True)
        )

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def check_rows(
    specs: Sequence[TensorSpec], shapes: Mapping[str, Sequence[int]], limit: int, setting: str
) -> None:
    """Refuse a request whose batch holds more than ``limit`` rows: the first dimension
    of each input whose spec leaves it open. A model's memory grows with its rows (a
    runtime plans every intermediate tensor for the whole batch), so one request must
    not hold more than the server would batch together. ``setting`` names the limit
    in the message (``max_batch_size``, ``[limits] max_request_rows``).

    Raises:
        InputError: too many rows; the message names the input, its rows and the limit.
    """
    for spec in specs:
        shape = shapes.get(spec.name)
        if shape and spec.shape and spec.shape[0] < 0 and shape[0] > limit:
            raise InputError(
                f"input {spec.name!r} holds {shape[0]} rows, more than the {limit} a request "
                f"may ({setting}): send them in several requests",
                input_name=spec.name,
            )


def validate_inputs(
    specs: Sequence[TensorSpec], inputs: Mapping[str, Any]
) -> dict[str, np.ndarray[Any, Any]]:
    """Check ``inputs`` against ``specs``; return them as arrays of the expected dtypes.

    Array-likes (lists, scalars) are converted with ``np.asarray`` first;
    which dtypes are converted is in the module docstring.

    Raises:
        InputError: an unknown or missing input name, a ragged list, a wrong
            rank or shape, or a dtype that cannot be cast safely (or values
            that do not survive the cast); the message names the input, what
            came and what was expected.
    """
    if len(inputs) != len(specs) or any(spec.name not in inputs for spec in specs):
        _raise_name_mismatch(specs, inputs)
    checked: dict[str, np.ndarray[Any, Any]] = {}
    for spec in specs:
        array = convert_input(spec, inputs[spec.name])
        if not spec.accepts_shape(array.shape):
            what = "rank" if array.ndim != len(spec.shape) else "shape"
            raise InputError(
                f"input {spec.name!r}: wrong {what}: got shape {format_shape(array.shape)}, "
                f"expected {format_shape(spec.shape)}",
                input_name=spec.name,
            )
        checked[spec.name] = array
    return checked


def convert_input(spec: TensorSpec, value: Any) -> np.ndarray[Any, Any]:
    """``value`` as an array of ``spec.dtype``, cast as :func:`validate_inputs` casts
    (its shape unchecked).

    Raises:
        InputError: a dtype that cannot be cast safely, or values that do not survive it.
    """
    if isinstance(value, np.ndarray):
        array, from_python = value, False
    else:
        try:
            array = np.asarray(value)
        except ValueError as exc:
            # a ragged list ([[1, 2], [3]]): NumPy cannot make one array of it
            raise InputError(
                f"input {spec.name!r}: not a regular array (rows of different lengths?); "
                f"expected {spec.datatype} values of shape {format_shape(spec.shape)}",
                input_name=spec.name,
            ) from exc
        from_python = True
    if array.dtype == spec.dtype:
        return array
    if np.can_cast(array.dtype, spec.dtype, casting="safe") or (
        array.size == 0 and array.dtype.kind in "biuf"
    ):
        return array.astype(spec.dtype)
    problem = _unsafe_cast_problem(array, spec.dtype, from_python)
    if problem is None:
        return array.astype(spec.dtype)
    raise InputError(
        f"input {spec.name!r}: datatype {_describe_dtype(array.dtype)} cannot be "
        f"converted safely to the expected {spec.datatype}{problem}",
        input_name=spec.name,
    )


def _unsafe_cast_problem(
    array: np.ndarray[Any, Any], target: np.dtype[Any], from_python: bool
) -> str | None:
    """``None`` when a cast NumPy calls unsafe is safe for these values (the module
    docstring lists the cases); else what goes wrong, as the end of a message
    (``''`` when the dtypes alone rule it out)."""
    kind, name = array.dtype.kind, _describe_dtype(target)
    if kind == "f" and target.kind == "f":
        # nan and inf stay what they are; a finite value must not become inf
        finite = array[np.isfinite(array)]
        limit = float(np.finfo(target).max)
        largest = float(np.abs(finite).max()) if finite.size else 0.0
        if largest > limit:
            return f": a value of magnitude {largest:g} is beyond {name}'s range (±{limit:g})"
        return None
    if kind in "iu" and target.kind == "f":
        with np.errstate(invalid="ignore", over="ignore"):  # too large: refused just below
            back = array.astype(target).astype(array.dtype)
        if np.array_equal(back, array):
            return None
        return f": a value is too large to be represented exactly in {name}"
    if kind in "iu" and target.kind in "iu" and from_python:
        info = np.iinfo(target)
        low, high = int(array.min()), int(array.max())
        if info.min <= low and high <= info.max:
            return None
        return f": values from {low} to {high} do not fit {name} ({info.min} to {info.max})"
    return ""


def _describe_dtype(dtype: np.dtype[Any]) -> str:
    try:
        return datatype_of(dtype)
    except ValueError:
        return str(dtype)


def _raise_name_mismatch(specs: Sequence[TensorSpec], inputs: Mapping[str, Any]) -> None:
    expected = [spec.name for spec in specs]
    unknown = sorted(set(inputs) - set(expected))
    missing = [name for name in expected if name not in inputs]
    wanted = ", ".join(repr(name) for name in expected)
    if unknown:
        raise InputError(
            f"unknown input {unknown[0]!r}; the model takes {wanted}", input_name=unknown[0]
        )
    raise InputError(
        f"missing input {missing[0]!r}; the model takes {wanted}", input_name=missing[0]
    )
