"""The ONNX Runtime backend.

Execution providers come from :class:`RuntimeOptions` in order of preference
(on a Jetson: TensorRT, then CUDA, then CPU). A provider that this build of
ONNX Runtime lacks is skipped with a warning; one that is present but fails
to initialise is dropped by ONNX Runtime itself, and :attr:`Session.device`
tells what actually runs. The CPU provider is always the last resort.

The CPU arena is given back after a run much larger than the session's usual ones
(:meth:`OnnxSession._outlier`), so that one large request does not keep its peak.

ONNX Runtime's exceptions (the ``onnxruntime_pybind11_state`` classes, plus
``RuntimeError``/``ValueError`` from its Python wrapper) are translated here
and nowhere else: ``INVALID_ARGUMENT`` while running (an index out of range,
say) is the caller's :class:`InputError`; anything else an ``InferenceError``.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from edge_core.errors import BackendUnavailableError, InferenceError, InputError, ModelLoadError
from edge_core.logs import warn_once
from edge_core.runtime.base import Array, RuntimeOptions, Session
from edge_core.tensors import TensorSpec

__all__ = ["OnnxSession"]

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
SHRINK_WINDOW = 32  # runs remembered to tell one that stands out from the usual
_ORT_TYPES = {
    "tensor(float)": "FP32",
    "tensor(float16)": "FP16",
    "tensor(double)": "FP64",
    "tensor(int8)": "INT8",
    "tensor(uint8)": "UINT8",
    "tensor(int16)": "INT16",
    "tensor(uint16)": "UINT16",
    "tensor(int32)": "INT32",
    "tensor(uint32)": "UINT32",
    "tensor(int64)": "INT64",
    "tensor(uint64)": "UINT64",
    "tensor(bool)": "BOOL",
    "tensor(string)": "BYTES",
}


def _import_ort() -> tuple[Any, tuple[type[BaseException], ...], type[BaseException]]:
    try:
        import onnxruntime as ort
        from onnxruntime.capi import onnxruntime_pybind11_state as state
    except ImportError as exc:
        raise BackendUnavailableError(
            "ONNX Runtime is not installed (the 'onnx' extra: pip install "
            "'edge-inference[onnx]'; on a Jetson, NVIDIA's onnxruntime-gpu)"
        ) from exc
    errors = tuple(
        obj for obj in vars(state).values() if isinstance(obj, type) and issubclass(obj, Exception)
    )
    return ort, (*errors, RuntimeError, ValueError), state.InvalidArgument


def choose_providers(wanted: tuple[str, ...], available: list[str]) -> tuple[list[str], list[str]]:
    """The providers to ask for, in order, and a warning for each one skipped.

    Pure: ``available`` is what ``onnxruntime.get_available_providers()`` says.
    """
    chosen: list[str] = []
    warnings: list[str] = []
    for name in wanted:
        if name in available:
            if name not in chosen:
                chosen.append(name)
        else:
            warnings.append(
                f"execution provider {name} is not available in this ONNX Runtime build; "
                "falling back to the next one"
            )
    if CPU not in chosen:
        chosen.append(CPU)
    return chosen, warnings


def _status_message(exc: BaseException) -> str:
    text = str(exc)
    marker = "Status Message: "
    return text[text.index(marker) + len(marker) :] if marker in text else text


def _spec(node: Any) -> TensorSpec:
    datatype = _ORT_TYPES.get(node.type)
    if datatype is None:
        raise ModelLoadError(f"tensor {node.name!r} has an unsupported type {node.type}")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in node.shape)
    return TensorSpec(node.name, datatype, shape)


class OnnxSession(Session):
    """A model loaded into an ``onnxruntime.InferenceSession``."""

    backend = "onnxruntime"

    def __init__(self, model: bytes | str, options: RuntimeOptions | None = None) -> None:
        """Load ``model`` (the bytes of an ``.onnx`` file, or its path).

        Raises:
            BackendUnavailableError: ONNX Runtime is not installed.
            ModelLoadError: ONNX Runtime refused the model.
        """
        options = options or RuntimeOptions()
        ort, self._errors, self._invalid_argument = _import_ort()
        session_options = ort.SessionOptions()
        # Failures reach the caller as exceptions; ONNX Runtime's own log would repeat them.
        session_options.log_severity_level = 4
        session_options.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[options.graph_optimization]
        if options.threads is not None:
            session_options.intra_op_num_threads = options.threads
        if options.inter_op_threads is not None:
            session_options.inter_op_num_threads = options.inter_op_threads
        if not options.allow_spinning:
            session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            session_options.add_session_config_entry("session.inter_op.allow_spinning", "0")

        providers, warnings = choose_providers(options.providers, ort.get_available_providers())
        for warning in warnings:
            warn_once(log, warning)
        provider_options = [dict(options.provider_options.get(name, {})) for name in providers]
        try:
            session = ort.InferenceSession(
                model,
                sess_options=session_options,
                providers=providers,
                provider_options=provider_options,
            )
        except self._errors as exc:
            raise ModelLoadError(f"ONNX Runtime cannot load the model: {exc}") from exc
        used = session.get_providers()
        for name in providers:
            if name not in used:
                message = f"execution provider {name} failed to initialise; using {used[0]}"
                log.warning(message)
                warnings.append(message)
        self._session = session
        self._output_names = [node.name for node in session.get_outputs()]
        self._shrink = ort.RunOptions()
        self._shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        self._recent: deque[int] = deque(maxlen=SHRINK_WINDOW)
        self._recent_lock = threading.Lock()
        super().__init__(
            tuple(_spec(node) for node in session.get_inputs()),
            tuple(_spec(node) for node in session.get_outputs()),
            device=",".join(used),
            warnings=warnings,
        )

    def _outlier(self, feeds: dict[str, Array]) -> bool:
        """Whether a run is larger than this session's usual (its inputs over twice the
        largest of the last :data:`SHRINK_WINDOW` runs'): its memory is then given back
        when it ends. ONNX Runtime's arena keeps what its largest run needed, and every
        run pays the page faults of a fresh allocation without it: so only a run that
        stands out shrinks it, and one the session keeps seeing becomes the usual."""
        size = sum(value.nbytes for value in feeds.values())
        with self._recent_lock:
            usual = max(self._recent, default=None)
            self._recent.append(size)
        return usual is not None and size > 2 * usual

    def _run(self, feeds: dict[str, Array]) -> dict[str, Array]:
        options = self._shrink if self._outlier(feeds) else None
        try:
            results = self._session.run(self._output_names, feeds, options)
        except self._invalid_argument as exc:
            # e.g. an index input out of range: the caller's values, not the model, are at fault
            raise InputError(f"the model refused the input: {_status_message(exc)}") from exc
        except self._errors as exc:
            raise InferenceError(f"ONNX Runtime failed: {exc}") from exc
        return dict(zip(self._output_names, results, strict=True))

    def raw_call(self, inputs: Mapping[str, Array]) -> Callable[[], Any]:
        session, names = self._session, self._output_names
        feeds = {name: np.asarray(value) for name, value in inputs.items()}
        return lambda: session.run(names, feeds)
