"""The runtime interface: a :class:`Session` is one loaded model variant.

Callers hand a session a mapping of input name to array and get a dict of
output name to array. Before the runtime sees anything the inputs are
validated against the session's :attr:`Session.inputs` (see
:func:`edge_core.tensors.validate_inputs`); quantized INT8/UINT8 tensors are
converted with their scale and zero point, so callers always pass and receive
float arrays. Backends implement :meth:`Session._run` on validated arrays and
translate their library's exceptions into :mod:`edge_core.errors`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from edge_core.errors import ConfigError
from edge_core.tensors import Quantization, TensorSpec, validate_inputs

__all__ = [
    "DelegateSpec",
    "RuntimeOptions",
    "Session",
    "dequantize",
    "native_stderr_to_log",
    "quantize",
]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def native_stderr_to_log(logger: logging.Logger) -> Iterator[None]:
    """Route what native code writes to the process's stderr meanwhile into ``logger``:
    ``INFO:`` lines (LiteRT's "Created TensorFlow Lite XNNPACK delegate for CPU.") at
    debug level, anything else as a warning, so that a library's chatter stays out of
    the command line's output and the service's JSON log, and nothing it says is lost.

    File descriptor 2 is process-wide: another thread's writes meanwhile are routed
    too (and logged, not lost). A temporary file, not a pipe: a long message cannot
    block the writer.
    """
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all
        yield
        return
    with tempfile.TemporaryFile() as capture:
        try:
            sys.stderr.flush()
            os.dup2(capture.fileno(), 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            for line in capture.read().decode(errors="replace").splitlines():
                if line.strip():
                    level = logging.DEBUG if line.startswith("INFO:") else logging.WARNING
                    logger.log(level, "%s", line.strip())


Array = np.ndarray[Any, Any]
GRAPH_OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")


@dataclass(frozen=True)
class DelegateSpec:
    """A LiteRT external delegate: a shared library and its options."""

    library: str
    options: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RuntimeOptions:
    """How to run a model on this device; built from the device profile.

    Attributes:
        threads: intra-op threads (ONNX Runtime) and interpreter threads
            (LiteRT, XNNPACK). ``None``: the library's default.
        inter_op_threads: ONNX Runtime inter-op threads.
        graph_optimization: ONNX Runtime graph optimization level, one of
            ``disable``, ``basic``, ``extended``, ``all``.
        providers: ONNX Runtime execution providers in order of preference;
            those not available here are skipped with a warning, and the CPU
            provider is always the last resort.
        provider_options: options per execution provider name.
        allow_spinning: whether ONNX Runtime's threads spin while idle
            (lower latency, more power).
        delegates: LiteRT external delegates in order of preference; one that
            cannot be loaded is skipped with a warning (the CPU runs the model).
        xnnpack: whether LiteRT applies its default XNNPACK delegate.
        warmup: runs after loading, before the session is handed out.

    Raises:
        ConfigError: ``graph_optimization`` is not one of the levels above.
    """

    threads: int | None = None
    inter_op_threads: int | None = None
    graph_optimization: str = "all"
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    provider_options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    allow_spinning: bool = True
    delegates: tuple[DelegateSpec, ...] = ()
    xnnpack: bool = True
    warmup: int = 3

    def __post_init__(self) -> None:
        if self.graph_optimization not in GRAPH_OPTIMIZATION_LEVELS:
            allowed = ", ".join(repr(level) for level in GRAPH_OPTIMIZATION_LEVELS)
            raise ConfigError(
                f"expected one of {allowed}, got {self.graph_optimization!r}",
                field="RuntimeOptions.graph_optimization",
            )


def quantize(values: Array, quant: Quantization, dtype: np.dtype[Any]) -> Array:
    """Float values to the integers of an affine-quantized tensor (rounded, clipped)."""
    info = np.iinfo(dtype)
    # In place on one temporary: this runs on every call of a quantized model.
    scaled = values * np.float32(1.0 / quant.scale)
    scaled += np.float32(quant.zero_point)
    np.rint(scaled, out=scaled)
    np.maximum(scaled, info.min, out=scaled)
    np.minimum(scaled, info.max, out=scaled)
    result: Array = scaled.astype(dtype)
    return result


def dequantize(values: Array, quant: Quantization) -> Array:
    """The integers of an affine-quantized tensor back to float32 values."""
    result: Array = values.astype(np.float32)
    result -= np.float32(quant.zero_point)
    result *= np.float32(quant.scale)
    return result


class Session(ABC):
    """One loaded model variant, ready to run.

    Attributes:
        backend: the runtime's name (``onnxruntime``, ``litert``).
        inputs, outputs: what callers pass and receive (float for quantized tensors).
        device: what actually runs the model (execution providers or delegates).
        warnings: what fell back while loading (an execution provider or a
            delegate that was asked for and could not be used).
    """

    backend: ClassVar[str]

    def __init__(
        self,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        *,
        device: str,
        warnings: list[str] | None = None,
    ) -> None:
        self.inputs = inputs
        self.outputs = outputs
        self.device = device
        self.warnings = list(warnings or [])

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Array]:
        """Run the model on ``inputs`` (name -> array-like).

        Raises:
            InputError: the inputs do not fit the model (before the runtime runs).
            InferenceError: the runtime failed.
        """
        return self._run(validate_inputs(self.inputs, inputs))

    @abstractmethod
    def _run(self, feeds: dict[str, Array]) -> dict[str, Array]:
        """Run on validated arrays of the caller-facing dtypes."""

    @abstractmethod
    def raw_call(self, inputs: Mapping[str, Array]) -> Callable[[], Any]:
        """A closure making the bare library call on ``inputs``, prepared in advance.

        For benchmarks only: the floor that :meth:`run`'s own cost is measured
        against, on the same loaded model.
        """

    def warm_up(self, count: int) -> None:
        """Run ``count`` times on zeros (dynamic dimensions as 1).

        The first calls of a freshly loaded model are much slower (memory
        allocation, kernel selection, lazy initialisation of delegates).
        """
        if count <= 0:
            return
        zeros = {
            spec.name: np.zeros([d if d > 0 else 1 for d in spec.shape], dtype=spec.dtype)
            for spec in self.inputs
        }
        for _ in range(count):
            self._run(zeros)

    def close(self) -> None:  # noqa: B027 - optional hook: most backends free on garbage collection
        """Release what the runtime holds."""

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "device": self.device,
            "inputs": [spec.to_dict() for spec in self.inputs],
            "outputs": [spec.to_dict() for spec in self.outputs],
            "warnings": self.warnings,
        }
