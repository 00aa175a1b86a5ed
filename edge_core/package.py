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

This module is shared by the agent and the gateway (the gateway imports it,
never the reverse).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from edge_core.errors import ConfigError, ModelNotFoundError, PackageError
from edge_core.fields import Fields, is_decimal, load_document
from edge_core.tensors import DATATYPES, TensorSpec

__all__ = [
    "FORMATS",
    "MANIFEST",
    "PRECISIONS",
    "Golden",
    "ImagePreprocessing",
    "ModelPackage",
    "ModelRepository",
    "Tolerance",
    "Variant",
    "load_package",
    "package_from_files",
    "parse_manifest",
]

MANIFEST = "manifest.json"
FORMATS = ("onnx", "tflite")
PRECISIONS = ("fp32", "fp16", "int8")
TASKS = ("classification", "detection", "segmentation", "regression", "other")


class _ManifestError(PackageError, ConfigError):
    """A manifest field is wrong (both a package and a config problem)."""


@dataclass(frozen=True)
class Tolerance:
    """How close a variant's outputs must be to the reference outputs."""

    atol: float = 1e-5
    rtol: float = 1e-4

    def allclose(self, actual: np.ndarray[Any, Any], expected: np.ndarray[Any, Any]) -> bool:
        return bool(np.allclose(actual, expected, atol=self.atol, rtol=self.rtol))


@dataclass(frozen=True)
class Variant:
    """One runnable file of a model: a format and a precision."""

    id: str
    format: str
    precision: str
    file: str
    sha256: str
    size: int
    accuracy: float | None = None
    tolerance: Tolerance = field(default_factory=Tolerance)

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
        return self.root / variant.file

    def read_file(self, name: str) -> bytes:
        """One of the package's files (from memory when the package is held there).

        Raises:
            PackageError: the file is missing or unreadable.
        """
        if self.contents is not None:
            try:
                return self.contents[name]
            except KeyError:
                raise PackageError(
                    f"{self.qualified_name}: no file {name!r} in the package"
                ) from None
        path = self.root / name
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
        return out

    def write_manifest(self) -> Path:
        """Write ``manifest.json`` into :attr:`root`."""
        path = self.root / MANIFEST
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return path


def _tensor_specs(fields: Fields, key: str) -> tuple[TensorSpec, ...]:
    specs = []
    for item in fields.tables(key):
        spec = TensorSpec(
            name=item.string("name"),
            datatype=item.string("datatype", choices=list(DATATYPES)),
            shape=tuple(item.int_list("shape")),
        )
        item.done()
        specs.append(spec)
    if not specs:
        raise fields.fail(key, "expected at least one tensor")
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise fields.fail(key, "tensor names must be unique")
    return tuple(specs)


def _preprocessing(fields: Fields, inputs: tuple[TensorSpec, ...]) -> ImagePreprocessing:
    fields.string("type", choices=["image"])
    size = fields.int_list("size", None)
    if size is not None and (len(size) != 2 or min(size) < 1):
        raise fields.fail("size", f"expected [height, width] of positive integers, got {size}")
    value_range = fields.float_list("value_range", [0.0, 1.0])
    if len(value_range) != 2:
        raise fields.fail("value_range", f"expected [low, high], got {value_range}")
    mean = fields.float_list("mean", None)
    std = fields.float_list("std", None)
    if std is not None and any(s == 0 for s in std):
        raise fields.fail("std", "expected non-zero values")
    input_name = fields.string("input", inputs[0].name)
    if input_name not in {spec.name for spec in inputs}:
        raise fields.fail("input", f"expected the name of one of the inputs, got {input_name!r}")
    pre = ImagePreprocessing(
        input=input_name,
        color=fields.string("color", "rgb", choices=["gray", "rgb", "bgr"]),
        size=(size[0], size[1]) if size is not None else None,
        multiple_of=fields.integer("multiple_of", 1, minimum=1),
        interpolation=fields.string(
            "interpolation", "area", choices=["area", "linear", "nearest", "cubic"]
        ),
        value_range=(value_range[0], value_range[1]),
        mean=tuple(mean) if mean is not None else None,
        std=tuple(std) if std is not None else None,
        layout=fields.string("layout", "NHWC", choices=["NHWC", "NCHW", "NF"]),
        fit=fields.string("fit", "none", choices=["none", "box"]),
    )
    fields.done()
    return pre


def _variants(fields: Fields) -> tuple[Variant, ...]:
    variants = []
    for item in fields.tables("variants"):
        fmt = item.string("format", choices=FORMATS)
        precision = item.string("precision", choices=PRECISIONS)
        tol = item.table("tolerance", None)
        tolerance = Tolerance(
            atol=tol.number("atol", 1e-5, minimum=0.0), rtol=tol.number("rtol", 1e-4, minimum=0.0)
        )
        tol.done()
        file = item.string("file")
        if Path(file).name != file:
            raise item.fail("file", f"expected a file name inside the package, got {file!r}")
        sha256 = item.string("sha256")
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise item.fail("sha256", f"expected 64 lowercase hex digits, got {sha256!r}")
        variants.append(
            Variant(
                id=item.string("id", f"{fmt}-{precision}"),
                format=fmt,
                precision=precision,
                file=file,
                sha256=sha256,
                size=item.integer("size", minimum=0),
                accuracy=item.number("accuracy", None, minimum=0.0, maximum=1.0),
                tolerance=tolerance,
            )
        )
        item.done()
    if not variants:
        raise fields.fail("variants", "expected at least one variant")
    ids = [v.id for v in variants]
    if len(set(ids)) != len(ids):
        raise fields.fail("variants", f"variant ids must be unique, got {ids}")
    return tuple(variants)


def load_package(root: Path) -> ModelPackage:
    """Load and validate the package in ``root`` (the folder of one version).

    Raises:
        PackageError: the manifest is missing or wrong; the message names
            the file, the field and what was expected.
    """
    path = root / MANIFEST
    return parse_manifest(load_document(path, error=_ManifestError), root)


def package_from_files(files: Mapping[str, bytes], root: Path) -> ModelPackage:
    """A package held in memory (``files``: name -> content, with ``manifest.json``).

    ``root`` only names where it came from, in messages.

    Raises:
        PackageError: no manifest, or a wrong one.
    """
    try:
        data = json.loads(files[MANIFEST])
    except KeyError:
        raise PackageError(f"{root}: the package has no {MANIFEST}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _ManifestError(f"invalid JSON: {exc}", path=root / MANIFEST) from exc
    if not isinstance(data, dict):
        raise _ManifestError("expected an object at the top level", path=root / MANIFEST)
    return replace(parse_manifest(data, root, check_folder=False), contents=dict(files))


def parse_manifest(data: dict[str, Any], root: Path, *, check_folder: bool = True) -> ModelPackage:
    """A package from a parsed manifest (see :func:`load_package`)."""
    path = root / MANIFEST
    fields = Fields(data, path=path, error=_ManifestError)
    name = fields.string("name")
    version = fields.integer("version", minimum=1)
    inputs = _tensor_specs(fields, "inputs")
    outputs = _tensor_specs(fields, "outputs")
    labels = tuple(fields.str_list("labels", []))
    pre_fields = fields.table("preprocessing", None)
    preprocessing = _preprocessing(pre_fields, inputs) if fields.has("preprocessing") else None
    golden = fields.table("golden", None)
    golden_file = golden.string("file", None)
    golden.done()
    evaluation = fields.table("evaluation", None)
    evaluation_file = evaluation.string("file", None)
    evaluation_meta = {k: evaluation.raw(k) for k in evaluation.names() if k != "file"}
    package = ModelPackage(
        root=root,
        name=name,
        version=version,
        task=fields.string("task", "other", choices=TASKS),
        inputs=inputs,
        outputs=outputs,
        variants=_variants(fields),
        labels=labels,
        preprocessing=preprocessing,
        golden_file=golden_file,
        evaluation_file=evaluation_file,
        description=fields.string("description", ""),
        source=fields.string("source", ""),
        license=fields.string("license", ""),
        extra={"evaluation": evaluation_meta} if evaluation_meta else {},
    )
    fields.done()
    if check_folder and is_decimal(root.name) and int(root.name) != version:
        raise fields.fail("version", f"is {version} but the package lives in folder {root.name!r}")
    return package


class ModelRepository:
    """A directory of model packages (``<root>/<name>/<version>/manifest.json``)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            p.name for p in self.root.iterdir() if p.is_dir() and any(self._version_dirs(p.name))
        )

    def _version_dirs(self, name: str) -> Iterator[tuple[int, Path]]:
        folder = self.root / name
        if not folder.is_dir():
            return
        for child in folder.iterdir():
            if is_decimal(child.name) and (child / MANIFEST).is_file():
                yield int(child.name), child

    def versions(self, name: str) -> list[int]:
        return sorted(version for version, _ in self._version_dirs(name))

    def get(self, name: str, version: int | None = None) -> ModelPackage:
        """The package ``name`` at ``version`` (the newest when ``None``).

        Raises:
            ModelNotFoundError: no such model or version.
            PackageError: the package exists but its manifest is wrong.
        """
        versions = self.versions(name)
        if not versions:
            known = ", ".join(self.names()) or "none"
            raise ModelNotFoundError(
                f"unknown model {name!r} in {self.root}; available models: {known}"
            )
        if version is None:
            version = versions[-1]
        elif version not in versions:
            raise ModelNotFoundError(
                f"model {name!r} has no version {version}; available versions: "
                + ", ".join(map(str, versions))
            )
        return load_package(self.root / name / str(version))

    def packages(self) -> Iterator[ModelPackage]:
        """Every version of every model, by name then version."""
        for name in self.names():
            for version in self.versions(name):
                yield load_package(self.root / name / str(version))
