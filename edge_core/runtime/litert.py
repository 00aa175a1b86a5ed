"""The LiteRT backend (``ai_edge_litert``; ``tflite_runtime`` as a fallback import).

LiteRT applies XNNPACK to the CPU by default, with ``RuntimeOptions.threads``
threads. External delegates (an NPU's delegate library, the Edge TPU's
``libedgetpu.so.1``) come from the profile in order of preference; one that
cannot be loaded, or that refuses the model, is skipped with a warning and the
CPU runs the model instead.

Models with one signature (what TensorFlow's converter writes) are addressed by
the signature's input and output names; others by their tensor names. A tensor
whose batch dimension is dynamic in the model is resized to the caller's batch.
An interpreter is not thread-safe, so calls are serialised with a lock.

LiteRT's exceptions (``ValueError``, ``RuntimeError``, ``OSError`` from the
delegate loader) are translated here and nowhere else.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_core.errors import BackendUnavailableError, InferenceError, ModelLoadError
from edge_core.runtime.base import (
    Array,
    DelegateSpec,
    RuntimeOptions,
    Session,
    dequantize,
    native_stderr_to_log,
    quantize,
)
from edge_core.tensors import Quantization, TensorSpec, datatype_of

__all__ = ["LiteRTSession"]

log = logging.getLogger(__name__)

_ERRORS = (ValueError, RuntimeError)


def _import_litert() -> Any:
    try:
        from ai_edge_litert import interpreter
    except ImportError:
        try:
            from tflite_runtime import interpreter  # the last release needs NumPy 1
        except ImportError as exc:
            raise BackendUnavailableError(
                "LiteRT is not installed (the 'litert' extra: pip install 'edge-inference[litert]')"
            ) from exc
    return interpreter


def check_delegate_library(library: str) -> str | None:
    """Why ``library`` cannot be an external delegate, or ``None`` when it can.

    Checked with ``ctypes`` before LiteRT sees it: LiteRT's own loader leaves a
    half-built object behind on these failures.
    """
    try:
        handle = ctypes.CDLL(library)
    except OSError as exc:
        return f"cannot be loaded ({exc})"
    for symbol in ("tflite_plugin_create_delegate", "tflite_plugin_destroy_delegate"):
        if not hasattr(handle, symbol):
            return f"is not a TFLite external delegate (no {symbol})"
    return None


@dataclass
class _Binding:
    spec: TensorSpec  # what callers see
    index: int
    dtype: np.dtype[Any]  # what the interpreter holds
    quant: Quantization | None


def _binding(name: str, details: Mapping[str, Any]) -> _Binding:
    dtype = np.dtype(details["dtype"])
    signature = details.get("shape_signature")
    shape = tuple(int(d) for d in (signature if signature is not None else details["shape"]))
    params = details.get("quantization_parameters") or {}
    scales = params.get("scales", np.zeros(0))
    scale, zero_point = details.get("quantization", (0.0, 0))
    quant: Quantization | None = None
    if dtype.kind in "iu" and scale:
        if len(scales) > 1:
            raise ModelLoadError(f"tensor {name!r} is quantized per channel; not supported for I/O")
        quant = Quantization(scale=float(scale), zero_point=int(zero_point))
    try:
        storage = datatype_of(dtype)
    except ValueError as exc:
        raise ModelLoadError(f"tensor {name!r} has an unsupported type {dtype}") from exc
    spec = TensorSpec(
        name,
        "FP32" if quant is not None else storage,
        shape,
        quantization=quant,
        storage_datatype=storage if quant is not None else None,
    )
    return _Binding(spec=spec, index=int(details["index"]), dtype=dtype, quant=quant)


class LiteRTSession(Session):
    """A model loaded into a LiteRT ``Interpreter``."""

    backend = "litert"

    def __init__(self, model: bytes | str, options: RuntimeOptions | None = None) -> None:
        """Load ``model`` (the bytes of a ``.tflite`` file, or its path).

        Raises:
            BackendUnavailableError: neither ``ai_edge_litert`` nor ``tflite_runtime``
                is installed.
            ModelLoadError: LiteRT refused the model.
        """
        options = options or RuntimeOptions()
        interpreter_module = _import_litert()
        warnings: list[str] = []
        delegates, names = self._load_delegates(interpreter_module, options.delegates, warnings)
        source = {"model_content": model} if isinstance(model, bytes) else {"model_path": model}
        kwargs: dict[str, Any] = {"num_threads": options.threads}
        if not options.xnnpack:
            kwargs["experimental_op_resolver_type"] = (
                interpreter_module.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
            )
        try:
            with _first_interpreter():  # LiteRT's chatter: into the log
                try:
                    interpreter = interpreter_module.Interpreter(
                        **source, experimental_delegates=delegates or None, **kwargs
                    )
                except _ERRORS as exc:
                    if not delegates:
                        raise
                    message = (
                        f"delegate(s) {', '.join(names)} refused the model ({exc}); using the CPU"
                    )
                    log.warning(message)
                    warnings.append(message)
                    names = []
                    interpreter = interpreter_module.Interpreter(**source, **kwargs)
                interpreter.allocate_tensors()
        except _ERRORS as exc:
            raise ModelLoadError(f"LiteRT cannot load the model: {exc}") from exc

        inputs, outputs = self._io_details(interpreter)
        self._interpreter = interpreter
        self._inputs = [_binding(name, d) for name, d in inputs.items()]
        self._outputs = [_binding(name, d) for name, d in outputs.items()]
        self._shapes = {
            b.index: tuple(int(x) for x in inputs[b.spec.name]["shape"]) for b in self._inputs
        }
        self._lock = threading.Lock()
        cpu = "xnnpack" if options.xnnpack else "cpu"
        super().__init__(
            tuple(b.spec for b in self._inputs),
            tuple(b.spec for b in self._outputs),
            device=",".join([*names, cpu]),
            warnings=warnings,
        )

    @staticmethod
    def _load_delegates(
        module: Any, specs: tuple[DelegateSpec, ...], warnings: list[str]
    ) -> tuple[list[Any], list[str]]:
        delegates: list[Any] = []
        names: list[str] = []
        for spec in specs:
            problem = check_delegate_library(spec.library)
            if problem is None:
                try:
                    delegates.append(module.load_delegate(spec.library, dict(spec.options)))
                    names.append(spec.library)
                    continue
                except (*_ERRORS, OSError) as exc:
                    problem = f"failed to start ({exc})"
            message = f"delegate {spec.library} {problem}; falling back to the next one"
            log.warning(message)
            warnings.append(message)
        return delegates, names

    @staticmethod
    def _io_details(interpreter: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        signatures = interpreter.get_signature_list()
        if len(signatures) == 1:
            runner = interpreter.get_signature_runner(next(iter(signatures)))
            return dict(runner.get_input_details()), dict(runner.get_output_details())
        return (
            {d["name"]: d for d in interpreter.get_input_details()},
            {d["name"]: d for d in interpreter.get_output_details()},
        )

    def _run(self, feeds: dict[str, Array]) -> dict[str, Array]:
        try:
            with self._lock:
                interpreter = self._interpreter
                if interpreter is None:
                    raise InferenceError("the model was closed")
                for binding in self._inputs:
                    value = feeds[binding.spec.name]
                    if binding.quant is not None:
                        value = quantize(value, binding.quant, binding.dtype)
                    if value.shape != self._shapes[binding.index]:
                        interpreter.resize_tensor_input(binding.index, value.shape, strict=True)
                        interpreter.allocate_tensors()
                        self._shapes[binding.index] = value.shape
                    interpreter.set_tensor(binding.index, value)
                interpreter.invoke()
                results = {b.spec.name: interpreter.get_tensor(b.index) for b in self._outputs}
        except _ERRORS as exc:
            raise InferenceError(f"LiteRT failed: {exc}") from exc
        for binding in self._outputs:
            if binding.quant is not None:
                results[binding.spec.name] = dequantize(results[binding.spec.name], binding.quant)
        return results

    def raw_call(self, inputs: Mapping[str, Array]) -> Callable[[], Any]:
        self.run(inputs)  # sizes the interpreter's tensors for these inputs
        interpreter = self._interpreter
        prepared = []
        for binding in self._inputs:
            value = np.asarray(inputs[binding.spec.name])
            if binding.quant is not None:
                value = quantize(value, binding.quant, binding.dtype)
            prepared.append((binding.index, value.astype(binding.dtype)))
        outputs = [b.index for b in self._outputs]

        def call() -> list[Array]:
            for index, value in prepared:
                interpreter.set_tensor(index, value)
            interpreter.invoke()
            return [interpreter.get_tensor(index) for index in outputs]

        return call

    def close(self) -> None:
        with self._lock:  # a run in progress finishes first
            self._interpreter = None


_created = threading.Event()


@contextlib.contextmanager
def _first_interpreter() -> Iterator[None]:
    """LiteRT tells stderr once a process, from C++, that it made the XNNPACK delegate
    (when the first interpreter allocates its tensors): the first interpreter is made
    with its native stderr routed into the log."""
    if _created.is_set():
        yield
        return
    try:
        with native_stderr_to_log(log):
            yield
    finally:
        _created.set()
