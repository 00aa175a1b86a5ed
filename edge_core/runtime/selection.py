"""Which variant of a model to run: profile preferences x package x runtimes.

Pure: the caller passes the installed formats (see :func:`installed_formats`,
which looks for the libraries without importing them).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Collection, Sequence

from edge_core.errors import NoVariantError
from edge_core.package import FORMATS, PRECISIONS, ModelPackage, Variant

__all__ = ["RUNTIME_MODULES", "installed_formats", "rank_variants"]

#: The Python modules that can run each format, in order of preference.
RUNTIME_MODULES: dict[str, tuple[str, ...]] = {
    "onnx": ("onnxruntime",),
    "tflite": ("ai_edge_litert", "tflite_runtime"),
}


@functools.cache
def installed_formats() -> frozenset[str]:
    """The model formats whose runtime library is installed (nothing is imported).

    Looked up once a process: the agent asks on every request, and each lookup
    searches ``sys.path`` (tens of µs).
    """
    return frozenset(
        fmt
        for fmt, modules in RUNTIME_MODULES.items()
        if any(importlib.util.find_spec(module) is not None for module in modules)
    )


def rank_variants(
    package: ModelPackage,
    *,
    precisions: Sequence[str],
    formats: Sequence[str],
    installed: Collection[str],
    profile_name: str = "the profile",
) -> list[Variant]:
    """The package's variants this device can run, best first.

    Precision preference comes first, then format preference: a profile that
    prefers ``int8`` then ``fp32`` and ``tflite`` then ``onnx`` ranks
    ``tflite-int8``, ``onnx-int8``, ``tflite-fp32``, ``onnx-fp32``. Variants of
    a precision or format the profile does not list come last (a model that
    only ships FP16 still runs on a device that prefers INT8); variants whose
    runtime is not installed are left out.

    Raises:
        NoVariantError: none is left; the message says why.
    """

    def rank(order: Sequence[str], value: str, fallback: Sequence[str]) -> int:
        if value in order:
            return order.index(value)
        return len(order) + (fallback.index(value) if value in fallback else len(fallback))

    ranked = sorted(
        (v for v in package.variants if v.format in installed),
        key=lambda v: (
            rank(precisions, v.precision, PRECISIONS),
            rank(formats, v.format, FORMATS),
        ),
    )
    if ranked:
        return ranked
    offered = ", ".join(v.id for v in package.variants)
    raise NoVariantError(
        f"no variant of {package.qualified_name} can run here: it offers {offered}; "
        f"runtimes installed for formats: {', '.join(sorted(installed)) or 'none'} "
        f"({profile_name} prefers {', '.join(precisions)} in {', '.join(formats)})"
    )
