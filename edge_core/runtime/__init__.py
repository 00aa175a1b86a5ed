"""The runtime layer: one small interface (:class:`Session`), two backends.

- :class:`~edge_core.runtime.onnx.OnnxSession` runs ``.onnx`` variants on ONNX Runtime;
- :class:`~edge_core.runtime.litert.LiteRTSession` runs ``.tflite`` variants on LiteRT.

A backend's module (and its library) is imported only when a variant of its
format is opened, so a device that runs one TFLite model never pays for ONNX
Runtime's memory.

:func:`open_variant` loads one variant of a package, checks that the runtime's
view of the model agrees with the manifest, and warms it up.
:func:`open_best` walks the variants a profile ranks (see
:mod:`edge_core.runtime.selection`) and falls back to the next when one
cannot be loaded.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence

from edge_core.errors import BackendError, NoVariantError, PackageError
from edge_core.package import ModelPackage, Variant
from edge_core.runtime.base import DelegateSpec, RuntimeOptions, Session
from edge_core.runtime.selection import installed_formats, rank_variants
from edge_core.tensors import TensorSpec, format_shape

__all__ = [
    "DelegateSpec",
    "RuntimeOptions",
    "Session",
    "installed_formats",
    "open_best",
    "open_model",
    "open_variant",
    "rank_variants",
]

log = logging.getLogger(__name__)

_BACKENDS = {
    "onnx": ("edge_core.runtime.onnx", "OnnxSession"),
    "tflite": ("edge_core.runtime.litert", "LiteRTSession"),
}


def open_model(fmt: str, model: bytes | str, options: RuntimeOptions | None = None) -> Session:
    """Load a model file's bytes (or path) with the backend for ``fmt``.

    Raises:
        ValueError: ``fmt`` is not a known format.
        BackendUnavailableError: the runtime for ``fmt`` is not installed.
        ModelLoadError: the runtime refused the model.
    """
    try:
        module_name, class_name = _BACKENDS[fmt]
    except KeyError:
        raise ValueError(
            f"unknown model format {fmt!r}; expected one of {', '.join(_BACKENDS)}"
        ) from None
    backend: Callable[[bytes | str, RuntimeOptions | None], Session] = getattr(
        importlib.import_module(module_name), class_name
    )
    return backend(model, options)


def _check_against_manifest(
    declared: tuple[TensorSpec, ...], actual: tuple[TensorSpec, ...], what: str, where: str
) -> None:
    by_name = {spec.name: spec for spec in actual}
    if set(by_name) != {spec.name for spec in declared}:
        raise PackageError(
            f"{where}: the manifest's {what} ({', '.join(s.name for s in declared)}) do not match "
            f"the model's ({', '.join(by_name)})"
        )
    for spec in declared:
        real = by_name[spec.name]
        compatible = len(real.shape) == len(spec.shape) and all(
            a < 0 or b < 0 or a == b for a, b in zip(real.shape, spec.shape, strict=True)
        )
        if real.datatype != spec.datatype or not compatible:
            raise PackageError(
                f"{where}: {what[:-1]} {spec.name!r} is {spec.datatype} {format_shape(spec.shape)} "
                f"in the manifest but {real.datatype} {format_shape(real.shape)} in the model"
            )


def open_variant(
    package: ModelPackage,
    variant: Variant,
    options: RuntimeOptions | None = None,
    *,
    data: bytes | None = None,
) -> Session:
    """Load ``variant`` of ``package``, check it against the manifest, warm it up.

    ``data`` is the variant's bytes when the caller already holds them (an
    update decrypted in memory); otherwise the file is read and checked
    against the manifest's SHA-256.

    Raises:
        PackageError: the file is missing or corrupt, or the model's inputs
            and outputs disagree with the manifest.
        BackendError: the runtime is missing or refused the model.
    """
    options = options or RuntimeOptions()
    model = data if data is not None else package.read_variant(variant)
    session = open_model(variant.format, model, options)
    where = f"{package.qualified_name} variant {variant.id}"
    _check_against_manifest(package.inputs, session.inputs, "inputs", where)
    _check_against_manifest(package.outputs, session.outputs, "outputs", where)
    session.warm_up(options.warmup)
    return session


def open_best(
    package: ModelPackage,
    options: RuntimeOptions | None = None,
    *,
    precisions: Sequence[str] = ("fp32", "int8", "fp16"),
    formats: Sequence[str] = ("onnx", "tflite"),
    profile_name: str = "the profile",
) -> tuple[Variant, Session]:
    """Open the best variant the preferences allow, falling back to the next on failure.

    Raises:
        NoVariantError: no variant is allowed, or none could be loaded.
    """
    ranked = rank_variants(
        package,
        precisions=precisions,
        formats=formats,
        installed=installed_formats(),
        profile_name=profile_name,
    )
    failures = []
    for variant in ranked:
        try:
            return variant, open_variant(package, variant, options)
        except (BackendError, PackageError) as exc:
            log.warning(
                "cannot open %s %s (%s); trying the next variant",
                package.qualified_name,
                variant.id,
                exc,
            )
            failures.append(f"{variant.id}: {exc}")
    raise NoVariantError(
        f"no variant of {package.qualified_name} could be loaded: " + "; ".join(failures)
    )
