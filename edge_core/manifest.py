"""Reading a model package's ``manifest.json`` (see :mod:`edge_core.package` for the
format): from a folder (:func:`load_package`), from files held in memory (an update
decrypted there: :func:`package_from_files`), or from a parsed document
(:func:`parse_manifest`). A wrong field fails with the file, the field and what was
expected."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from edge_core.errors import PackageError
from edge_core.fields import Fields, is_decimal, load_document
from edge_core.package import (
    FILE_NAME_RULE,
    FORMATS,
    MANIFEST,
    PRECISIONS,
    TASKS,
    Cost,
    ImagePreprocessing,
    ManifestError,
    ModelPackage,
    Tolerance,
    Variant,
    is_file_name,
)
from edge_core.tensors import DATATYPES, TensorSpec

__all__ = ["load_package", "package_from_files", "parse_manifest", "parse_preprocessing"]


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
        max_pixels=fields.integer("max_pixels", None, minimum=1),
        lossless=fields.boolean("lossless", False),
        min_quality=fields.integer("min_quality", None, minimum=1, maximum=100),
    )
    fields.done()
    return pre


def _per_precision(fields: Fields) -> dict[str, int]:
    out = {}
    for precision in fields.names():
        if precision not in PRECISIONS:
            raise fields.fail(precision, f"expected one of {', '.join(PRECISIONS)}")
        out[precision] = fields.integer(precision, minimum=0)
    fields.done()
    return out


def _cost(fields: Fields) -> Cost:
    cost = Cost(
        flops=_per_precision(fields.table("flops")),
        elementwise=_per_precision(fields.table("elementwise", {})),
        depthwise=_per_precision(fields.table("depthwise", {})),
        memory_bytes=fields.integer("memory_bytes", minimum=0),
        nodes=fields.integer("nodes", minimum=0),
        batch=fields.integer("batch", 1, minimum=1),
    )
    fields.done()
    return cost


def _object(fields: Fields, key: str) -> dict[str, Any] | None:
    """An informative table, kept as written (what a build measured)."""
    if not fields.has(key):
        return None
    value = fields.raw(key)
    if not isinstance(value, dict):
        raise fields.fail(key, "expected an object")
    return value


def parse_preprocessing(
    data: Mapping[str, Any], inputs: tuple[TensorSpec, ...], path: Path
) -> ImagePreprocessing:
    """A ``preprocessing`` table read from its own file (``type`` defaults to ``image``).

    Raises:
        ManifestError: a field is wrong; the message names the file and the field.
    """
    fields = Fields({"type": "image", **data}, path=path, error=ManifestError)
    return _preprocessing(fields, inputs)


def _file_name(fields: Fields, key: str, *, optional: bool = False) -> Any:
    """A file the manifest points to: one rule (:func:`~edge_core.package.is_file_name`)
    for every such field, so that no manifest can name a file outside its package."""
    file = fields.string(key, None) if optional else fields.string(key)
    if file is not None and not is_file_name(file):
        raise fields.fail(key, f"expected {FILE_NAME_RULE}, got {file!r:.80}")
    return file


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
        file = _file_name(item, "file")
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
                cost=_cost(item.table("cost")) if item.has("cost") else None,
                verification=_object(item, "verification"),
                benchmark=_object(item, "benchmark"),
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
    return parse_manifest(load_document(path, error=ManifestError), root)


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
        raise ManifestError(f"invalid JSON: {exc}", path=root / MANIFEST) from exc
    if not isinstance(data, dict):
        raise ManifestError("expected an object at the top level", path=root / MANIFEST)
    return replace(parse_manifest(data, root, check_folder=False), contents=dict(files))


def parse_manifest(data: dict[str, Any], root: Path, *, check_folder: bool = True) -> ModelPackage:
    """A package from a parsed manifest (see :func:`load_package`)."""
    path = root / MANIFEST
    fields = Fields(data, path=path, error=ManifestError)
    name = fields.string("name")
    version = fields.integer("version", minimum=1)
    inputs = _tensor_specs(fields, "inputs")
    outputs = _tensor_specs(fields, "outputs")
    labels = tuple(fields.str_list("labels", []))
    pre_fields = fields.table("preprocessing", None)
    preprocessing = _preprocessing(pre_fields, inputs) if fields.has("preprocessing") else None
    golden = fields.table("golden", None)
    golden_file = _file_name(golden, "file", optional=True)
    golden.done()
    evaluation = fields.table("evaluation", None)
    evaluation_file = _file_name(evaluation, "file", optional=True)
    evaluation_meta = {k: evaluation.raw(k) for k in evaluation.names() if k != "file"}
    extra: dict[str, Any] = {"evaluation": evaluation_meta} if evaluation_meta else {}
    build = _object(fields, "build")
    if build is not None:
        extra["build"] = build
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
        extra=extra,
    )
    fields.done()
    if check_folder and is_decimal(root.name) and int(root.name) != version:
        raise fields.fail("version", f"is {version} but the package lives in folder {root.name!r}")
    return package
