"""Model packages: the on-disk format that devices run and the gateway serves.

A *model repository* is a directory of packages, one folder per model name
and one sub-folder per integer version (the layout Triton uses)::

    models/
      digits-light/
        1/
          manifest.json      name, version, task, inputs/outputs, labels,
                             preprocessing, variants, golden data, evaluation
          model.fp32.onnx    one file per variant (format x precision)
          model.int8.tflite
          golden.npz         golden inputs and reference outputs (smoke tests)
          heldout.npz        the held-out split the accuracies were measured on

Each variant records its SHA-256, size, measured accuracy and the tolerance
within which its outputs must match the reference outputs. The manifest's
inputs and outputs are what callers see: a quantized variant takes and gives
the same float tensors as the FP32 one.

This module holds the package's types; :mod:`edge_core.manifest` reads them
from a manifest, :mod:`edge_core.repository` finds them in a repository.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edge_core.errors import ConfigError, InputError, ModelNotFoundError, PackageError
from edge_core.tensors import TensorSpec

__all__ = [
    "FORMATS",
    "INPUT_PIXELS",
    "MANIFEST",
    "PRECISIONS",
    "Cost",
    "Golden",
    "ImagePreprocessing",
    "ModelPackage",
    "Tolerance",
    "Variant",
    "is_file_name",
]

MANIFEST = "manifest.json"
FORMATS = ("onnx", "tflite")
PRECISIONS = ("fp32", "fp16", "int8")
TASKS = ("classification", "detection", "segmentation", "regression", "other")


FILE_NAME_RULE = "a file name inside the package (no '/', '\\', '.' or '..')"


def is_file_name(name: object) -> bool:
    """Whether ``name`` names a file directly inside a package folder: every file a
    manifest points to (variants, golden and evaluation data) must, so that a package
    can never make a reader, a builder or the OTA archive open a file outside it."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\\0")
        and Path(name).name == name
    )


INPUT_PIXELS = 1280 * 960  # a free-size model's input at most, unless its manifest says


def _round_to(value: int, multiple: int) -> int:
    return max(multiple, round(value / multiple) * multiple)


class ManifestError(PackageError, ConfigError):
    """A manifest field is wrong (both a package and a config problem)."""


@dataclass(frozen=True)
class Tolerance:
    """How close a variant's outputs must be to the reference outputs."""

    atol: float = 1e-5
    rtol: float = 1e-4

    def allclose(self, actual: np.ndarray[Any, Any], expected: np.ndarray[Any, Any]) -> bool:
        return bool(np.allclose(actual, expected, atol=self.atol, rtol=self.rtol))


@dataclass(frozen=True)
class Cost:
    """What one run of a variant costs at ``batch`` (counted by ``edge-agent models
    build``): the operations of its multiply-accumulating operators (convolutions,
    matrix products; a multiply-accumulate is two) and those of the others
    (``elementwise``: one per output element), per compute precision (``fp32``,
    ``fp16``, ``int8``), with the depthwise convolutions' apart (``depthwise``: one
    input channel a group, which runs far below the other convolutions' rate);
    the bytes its operators read and write; the number of
    operators. A device profile's roofline turns it into a latency
    (:mod:`edge_agent.profiles.cost`) without opening the model."""

    flops: Mapping[str, int]
    memory_bytes: int
    nodes: int
    batch: int = 1
    elementwise: Mapping[str, int] = field(default_factory=dict)
    depthwise: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "flops": dict(self.flops),
            "elementwise": dict(self.elementwise),
            "depthwise": dict(self.depthwise),
            "memory_bytes": self.memory_bytes,
            "nodes": self.nodes,
            "batch": self.batch,
        }


@dataclass(frozen=True)
class Variant:
    """One runnable file of a model: a format and a precision.

    ``cost`` is what a run costs (for a latency prediction); ``verification``
    (its agreement with the FP32 variant) and ``benchmark`` (its latency on the
    machine that built it, which it names) are what the build measured, kept as
    written.
    """

    id: str
    format: str
    precision: str
    file: str
    sha256: str
    size: int
    accuracy: float | None = None
    tolerance: Tolerance = field(default_factory=Tolerance)
    cost: Cost | None = None
    verification: Mapping[str, Any] | None = None
    benchmark: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "format": self.format,
            "precision": self.precision,
            "file": self.file,
            "sha256": self.sha256,
            "size": self.size,
        }
        if self.accuracy is not None:
            out["accuracy"] = self.accuracy
        out["tolerance"] = {"atol": self.tolerance.atol, "rtol": self.tolerance.rtol}
        if self.cost is not None:
            out["cost"] = self.cost.to_dict()
        if self.verification is not None:
            out["verification"] = dict(self.verification)
        if self.benchmark is not None:
            out["benchmark"] = dict(self.benchmark)
        return out


@dataclass(frozen=True)
class ImagePreprocessing:
    """How an image file becomes the model's input tensor.

    The image is decoded, converted to ``color``, cropped when ``fit`` is
    ``box`` (to the square around what is brighter than the background, the
    thing centred in it: how data sets of drawn symbols such as digits were
    normalized), resized to ``size``
    (height, width; ``None`` keeps the image's size rounded to ``multiple_of``),
    its 0..255 values mapped linearly onto ``value_range``, then normalized
    per channel with ``mean`` and ``std`` when given, and laid out as
    ``layout``: ``NHWC``, ``NCHW`` or ``NF`` (flattened features).

    A model that keeps the picture's size takes at most ``max_pixels`` of it
    (:data:`INPUT_PIXELS` unless the manifest says): a larger picture is scaled
    down to fit, keeping its aspect, and a larger input tensor is refused
    (:meth:`check_input`), since such a model's memory grows with its input's
    pixels (about 180 MB a megapixel for CenterFace and PP-OCR's detector).

    When a picture is offloaded, it leaves encoded (JPEG or WebP at the policy's
    quality) unless the model needs every pixel as it was (``lossless``: PNG); to meet
    a deadline over a slow link its quality may step down to ``min_quality``, the
    lowest at which the model's answers still agree with its tensor's (``None``: never
    below the policy's).
    """

    input: str
    color: str = "rgb"
    size: tuple[int, int] | None = None
    multiple_of: int = 1
    interpolation: str = "area"
    value_range: tuple[float, float] = (0.0, 1.0)
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    layout: str = "NHWC"
    fit: str = "none"
    max_pixels: int | None = None
    lossless: bool = False
    min_quality: int | None = None

    @property
    def input_pixels(self) -> int:
        """The most pixels the model's input takes: ``size``'s, or ``max_pixels``."""
        if self.size is not None:
            return self.size[0] * self.size[1]
        return self.max_pixels or INPUT_PIXELS

    def input_size(self, height: int, width: int) -> tuple[int, int]:
        """The input's (height, width) for a picture of that size (after a ``fit``
        crop): ``size``, or the picture's own rounded to ``multiple_of``, scaled down
        first (rounded down then) to at most :attr:`input_pixels`."""
        if self.size is not None:
            return self.size
        multiple, budget = self.multiple_of, self.input_pixels
        rounded = (_round_to(height, multiple), _round_to(width, multiple))
        if rounded[0] * rounded[1] <= budget:
            return rounded
        scale = math.sqrt(budget / (height * width))
        return (
            max(multiple, int(height * scale) // multiple * multiple),
            max(multiple, int(width * scale) // multiple * multiple),
        )

    def check_input(self, shape: Sequence[int]) -> None:
        """Refuse an input tensor (of the preprocessed picture) larger than the model
        takes: its height and width (by ``layout``) within :attr:`input_pixels`.

        Raises:
            InputError: too many pixels; the message gives them and the limit.
        """
        if self.size is not None or self.layout == "NF" or len(shape) != 4:
            return  # a fixed size is the shape check's; a flat input has no sides
        height, width = (shape[2], shape[3]) if self.layout == "NCHW" else (shape[1], shape[2])
        if height * width > self.input_pixels:
            raise InputError(
                f"input {self.input!r} is {height}x{width} pixels, more than the "
                f"{self.input_pixels:,} the model takes (its preprocessing's max_pixels): "
                "scale the picture down, or send the picture itself",
                input_name=self.input,
            )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "image",
            "input": self.input,
            "color": self.color,
            "interpolation": self.interpolation,
            "value_range": list(self.value_range),
            "layout": self.layout,
        }
        if self.size is not None:
            out["size"] = list(self.size)
        if self.multiple_of != 1:
            out["multiple_of"] = self.multiple_of
        if self.mean is not None:
            out["mean"] = list(self.mean)
        if self.std is not None:
            out["std"] = list(self.std)
        if self.fit != "none":
            out["fit"] = self.fit
        if self.max_pixels is not None:
            out["max_pixels"] = self.max_pixels
        if self.lossless:
            out["lossless"] = True
        if self.min_quality is not None:
            out["min_quality"] = self.min_quality
        return out


@dataclass(frozen=True)
class Golden:
    """Golden inputs and the reference outputs they must produce."""

    inputs: dict[str, np.ndarray[Any, Any]]
    outputs: dict[str, np.ndarray[Any, Any]]


@dataclass(frozen=True)
class ModelPackage:
    """A loaded manifest and the folder it lives in."""

    root: Path
    name: str
    version: int
    task: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    variants: tuple[Variant, ...]
    labels: tuple[str, ...] = ()
    preprocessing: ImagePreprocessing | None = None
    golden_file: str | None = None
    evaluation_file: str | None = None
    description: str = ""
    source: str = ""
    license: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # The package's files held in memory (an update decrypted for loading, never
    # written out in plaintext); ``None``: the files are in ``root``.
    contents: Mapping[str, bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def qualified_name(self) -> str:
        return f"{self.name}:{self.version}"

    def variant(self, variant_id: str) -> Variant:
        """The variant with that id.

        Raises:
            ModelNotFoundError: the package has no such variant.
        """
        for variant in self.variants:
            if variant.id == variant_id:
                return variant
        known = ", ".join(v.id for v in self.variants)
        raise ModelNotFoundError(
            f"model {self.qualified_name} has no variant {variant_id!r}; it has {known}"
        )

    def path_of(self, variant: Variant) -> Path:
        return self.file_path(variant.file)

    def file_path(self, name: str) -> Path:
        """Where the package's file ``name`` is on disk.

        Raises:
            PackageError: ``name`` is not a file name inside the package.
        """
        if not is_file_name(name):
            raise PackageError(f"{self.qualified_name}: {name!r:.80} is not {FILE_NAME_RULE}")
        return self.root / name

    def read_file(self, name: str) -> bytes:
        """One of the package's files (from memory when the package is held there).

        Raises:
            PackageError: the file is missing or unreadable.
        """
        path = self.file_path(name)
        if self.contents is not None:
            try:
                return self.contents[name]
            except KeyError:
                raise PackageError(
                    f"{self.qualified_name}: no file {name!r} in the package"
                ) from None
        try:
            return path.read_bytes()
        except OSError as exc:
            raise PackageError(
                f"{self.qualified_name}: cannot read {path}: {exc.strerror}"
            ) from exc

    def read_variant(self, variant: Variant) -> bytes:
        """The variant's file, checked against its recorded length and SHA-256.

        Raises:
            PackageError: the file is missing or does not match the manifest.
        """
        path = self.path_of(variant)
        data = self.read_file(variant.file)
        if len(data) != variant.size or hashlib.sha256(data).hexdigest() != variant.sha256:
            raise PackageError(
                f"{self.qualified_name}: variant {variant.id} ({path}) does not match the "
                f"manifest's size and SHA-256; the file is corrupt or was replaced"
            )
        return data

    def golden(self) -> Golden:
        """The golden inputs and reference outputs.

        Raises:
            PackageError: the package has none, or the file is unreadable.
        """
        if self.golden_file is None:
            raise PackageError(f"{self.qualified_name} has no golden data")
        arrays = self._load_npz(self.golden_file)
        inputs = {k.removeprefix("input:"): v for k, v in arrays.items() if k.startswith("input:")}
        outputs = {
            k.removeprefix("output:"): v for k, v in arrays.items() if k.startswith("output:")
        }
        return Golden(inputs=inputs, outputs=outputs)

    def evaluation(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The held-out split ``(inputs, labels)`` the accuracies were measured on.

        Raises:
            PackageError: the package has none, or the file is unreadable.
        """
        if self.evaluation_file is None:
            raise PackageError(f"{self.qualified_name} has no evaluation data")
        arrays = self._load_npz(self.evaluation_file)
        try:
            return arrays["inputs"], arrays["labels"]
        except KeyError as exc:
            raise PackageError(
                f"{self.qualified_name}: {self.evaluation_file} lacks {exc.args[0]!r}"
            ) from None

    def _load_npz(self, name: str) -> dict[str, np.ndarray[Any, Any]]:
        data = self.read_file(name)
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                return {key: npz[key] for key in npz.files}
        except (OSError, ValueError, EOFError) as exc:
            raise PackageError(f"{self.qualified_name}: cannot read {name}: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "version": self.version,
            "task": self.task,
            "description": self.description,
            "inputs": [spec.to_dict() for spec in self.inputs],
            "outputs": [spec.to_dict() for spec in self.outputs],
        }
        if self.labels:
            out["labels"] = list(self.labels)
        if self.preprocessing is not None:
            out["preprocessing"] = self.preprocessing.to_dict()
        out["variants"] = [variant.to_dict() for variant in self.variants]
        if self.golden_file is not None:
            out["golden"] = {"file": self.golden_file}
        if self.evaluation_file is not None:
            out["evaluation"] = {"file": self.evaluation_file, **self.extra.get("evaluation", {})}
        if self.source:
            out["source"] = self.source
        if self.license:
            out["license"] = self.license
        if "build" in self.extra:
            out["build"] = self.extra["build"]
        return out

    def write_manifest(self) -> Path:
        """Write ``manifest.json`` into :attr:`root`."""
        path = self.root / MANIFEST
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return path
