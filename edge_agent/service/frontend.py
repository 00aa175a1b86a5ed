"""What the local API's two front ends (HTTP and gRPC) share: one request through
the agent, the decision in the response, errors as statuses, and the count of
requests in flight that a stop waits for.

The label (the data's sensitivity) comes from the ``X-Edge-Label`` header or
``x-edge-label`` gRPC metadata, or the request parameter ``edge_label``; the
deadline from the protocol's ``timeout`` parameter (µs). The response's
parameters say what the agent did: ``edge_action``, ``edge_reason``,
``edge_where`` (device, cloud or cache), ``edge_model`` (the model that
answered), ``edge_degraded`` and ``request_id``.

One model-like name is the agent's own: ``redact`` (unless a model of that name
is on the device) hides the faces in every picture it is sent, tensors or
encoded image files under any input names, on the device (nothing is
offloaded), and answers the same inputs redacted plus ``faces`` (``INT32``
``[1]``, how many the detector found). The request parameters ``mode``
(``pixelate``, ``blur``, ``fill``) and ``mask_scale`` override the policy's.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np

from edge_agent.agent import Agent, AgentResult
from edge_agent.preprocess import encoded_pictures
from edge_agent.privacy import Redaction
from edge_agent.results import describe_outputs, json_line, per_row, reads
from edge_agent.service.logs import request_id as current_request_id
from edge_agent.service.metrics import ServiceMetrics
from edge_core.errors import InputError, ModelNotFoundError, Stopping
from edge_core.names import check_model_name, parse_version
from edge_core.package import ModelPackage
from edge_core.protocol.types import InferRequest, InferResponse, RequestedOutput
from edge_core.status import status_of

__all__ = ["REDACT", "LocalService"]

REDACT = "redact"
RESULTS = "results"  # the decoded results' output, asked for by name: a JSON document a row

log = logging.getLogger(__name__)


def _label(request: InferRequest, header: str | None) -> str | None:
    label = header or request.parameters.get("edge_label")
    if label is not None and not isinstance(label, str):
        raise InputError(f"parameter 'edge_label' must be a string, got {label!r}")
    return label


class LocalService:
    """Runs requests through the agent of the moment (a reload swaps it)."""

    def __init__(self, agent: Callable[[], Agent], metrics: ServiceMetrics) -> None:
        self._agent = agent
        self.metrics = metrics
        self._accepting = True
        self._inflight = 0
        self._idle = threading.Condition()
        self._users: dict[int, int] = {}  # id(agent) -> requests using it
        self._retired: dict[int, Agent] = {}  # replaced agents, closed when unused
        self.streams: Any = None  # the daemon's Streams (their events on the HTTP API)

    @property
    def agent(self) -> Agent:
        return self._agent()

    # -- life -----------------------------------------------------------------------------

    @contextmanager
    def _tracked(self) -> Iterator[Agent]:
        """The agent to answer with, counted as in use until the request is done."""
        with self._idle:
            if not self._accepting:
                raise Stopping("the agent is stopping")
            agent = self.agent
            self._inflight += 1
            self._users[id(agent)] = self._users.get(id(agent), 0) + 1
        try:
            yield agent
        finally:
            retired = None
            with self._idle:
                self._inflight -= 1
                left = self._users[id(agent)] = self._users[id(agent)] - 1
                if left == 0:
                    del self._users[id(agent)]
                    retired = self._retired.pop(id(agent), None)
                self._idle.notify_all()
            if retired is not None:
                self._close(retired)

    def retire(self, agent: Agent) -> None:
        """Close ``agent`` (replaced by a reload) once no request uses it any more."""
        with self._idle:
            if self._users.get(id(agent)):
                self._retired[id(agent)] = agent
                return
        self._close(agent)

    @staticmethod
    def _close(agent: Agent) -> None:
        try:
            agent.close()
        except Exception:
            log.exception("closing the replaced agent")

    def stop_accepting(self) -> None:
        with self._idle:
            self._accepting = False

    def drain(self, timeout: float) -> bool:
        """Wait until no request is in flight (or ``timeout``); whether it emptied."""
        end = time.monotonic() + timeout
        with self._idle:
            while self._inflight:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def ready(self) -> bool:
        return self._accepting

    # -- requests ---------------------------------------------------------------------------

    def infer(
        self, request: InferRequest, *, label: str | None = None, request_id: str | None = None
    ) -> InferResponse:
        """Answer one request through the agent; every request is counted, answered or
        not, by the action and reason of its decision (or its error's kind).

        Raises:
            EdgeError: mapped to a status by :func:`edge_core.status.status_of`.
        """
        rid = request_id or request.id or uuid.uuid4().hex
        token = current_request_id.set(rid)
        started = time.perf_counter()
        try:
            with self._tracked() as agent:
                name = check_model_name(request.model_name)
                version = parse_version(request.model_version)
                package = agent.package(name)
                if name == REDACT and package is None:
                    return self._redact(agent, request, rid, started)
                result, outputs = self._run(agent, request, name, version, package, label, rid)
        except Exception as exc:
            self._count_failure(request, exc)
            raise
        finally:
            current_request_id.reset(token)
        decision = result.decision
        self.metrics.request(
            self._label_of(request.model_name),
            decision.action.value,
            decision.reason,
            result.where,
            time.perf_counter() - started,
        )
        parameters: dict[str, Any] = {
            "edge_action": decision.action.value,
            "edge_reason": decision.reason,
            "edge_where": result.where,
            "edge_model": result.model,
            "edge_degraded": result.degraded,
            "request_id": rid,
        }
        if result.wire_bytes is not None:  # answered by the cloud: what the link carried
            parameters["edge_bytes_sent"], parameters["edge_bytes_received"] = result.wire_bytes
        return InferResponse(
            model_name=request.model_name,
            model_version=str(result.version or ""),
            outputs=outputs,
            id=request.id,
            parameters=parameters,
        )

    def _run(
        self,
        agent: Agent,
        request: InferRequest,
        name: str,
        version: int | None,
        package: ModelPackage | None,
        label: str | None,
        rid: str,
    ) -> tuple[AgentResult, dict[str, Any]]:
        """The agent's result and the outputs asked for (all when none are named).

        A model the device does not have goes to the gateway, if there is one;
        pictures sent as files are preprocessed as the manifest says; the
        ``results`` output is what the model's outputs mean, for a model whose
        outputs something here reads.

        Raises:
            ModelNotFoundError: no such model here, and no gateway to ask.
            InputError: ``results`` asked of a model nothing reads, or an unknown output.
        """
        if agent.offload is None and package is None:
            raise ModelNotFoundError(
                f"unknown model {name!r}: not on this device, and no gateway to ask"
            )
        wanted = request.outputs
        readable = wanted is not None and any(o.name == RESULTS for o in wanted)
        if readable and package is not None and not reads(package):
            raise InputError(
                f"model {name!r} has no {RESULTS!r} output: nothing here reads what "
                f"a {package.task} model's outputs mean; ask for its own outputs"
            )
        # pictures as files (a camera's JPEG): preprocessed as the manifest says
        inputs, sizes = (
            encoded_pictures(package, request.inputs, max_pixels=agent.max_pixels)
            if package
            else (request.inputs, None)
        )
        timeout_us = request.timeout_us
        result = agent.infer(
            name,
            inputs,
            label=_label(request, label),
            deadline_ms=timeout_us / 1000 if timeout_us else None,
            request_id=rid,
            version=version,
        )
        outputs = result.outputs
        if readable and RESULTS not in outputs:
            outputs = {**outputs, RESULTS: _results(agent, result, sizes)}
        return result, _asked_for(outputs, wanted, f"for model {result.model!r}")

    def _count_failure(self, request: InferRequest, exc: Exception) -> None:
        """Count a request that was not answered (by its decision when the policy refused
        it, else by its error's kind); log it when it is the service's fault."""
        status = status_of(exc)
        decision = getattr(exc, "decision", None)
        action = decision.action.value if decision is not None else "error"
        reason = decision.reason if decision is not None else status.kind
        self.metrics.request(self._label_of(request.model_name), action, reason, None, 0.0)
        if status.http >= 500:
            log.error("request for %.140r failed: %s", request.model_name, status.message)

    def explain(self, request: InferRequest, *, label: str | None = None) -> dict[str, Any]:
        """Where the running agent would answer ``request``, and why, with the findings
        behind it: :meth:`Agent.explain`, knowing what this agent has learnt (its link,
        its models' latency, what the cloud has). Nothing leaves the device.

        Raises:
            EdgeError: mapped to a status by :func:`edge_core.status.status_of`.
        """
        with self._tracked() as agent:
            name = check_model_name(request.model_name)
            package = agent.package(name)
            inputs, _ = (
                encoded_pictures(package, request.inputs, max_pixels=agent.max_pixels)
                if package
                else (request.inputs, None)
            )
            timeout_us = request.timeout_us
            decision, findings = agent.explain(
                name,
                inputs,
                label=_label(request, label),
                deadline_ms=timeout_us / 1000 if timeout_us else None,
            )
        return {**decision.to_dict(), "findings": findings.to_dict(), "profile": agent.profile.id}

    def repository_index(self) -> list[dict[str, str]]:
        """The models on the device, as the repository extension lists them: READY when
        this device can run one (a variant its runtimes and profile allow); and the
        ``redact`` endpoint, unless a model takes its name."""
        agent = self.agent
        index = []
        names = agent.models.names()
        for name in names:
            package = agent.package(name)
            if package is None:
                continue
            runs = agent.models.best_variant(package) is not None
            entry = {"name": name, "version": str(package.version)}
            entry["state"] = "READY" if runs else "UNAVAILABLE"
            if not runs:
                entry["reason"] = "no variant this device's runtimes and profile can run"
            index.append(entry)
        if REDACT not in names:
            index.append({"name": REDACT, "version": "1", "state": "READY"})
        return index

    def _redact(
        self, agent: Agent, request: InferRequest, rid: str, started: float
    ) -> InferResponse:
        """The ``redact`` endpoint: the inputs with their faces hidden, and their count."""
        redacted = agent.redact(
            request.inputs, _redaction(request.parameters, agent.inspector.redaction)
        )
        outputs = _asked_for(
            {**redacted.outputs, "faces": np.array([redacted.faces], np.int32)},
            request.outputs,
            f"of {REDACT!r}",
        )
        self.metrics.request(REDACT, "redact", "redacted", "device", time.perf_counter() - started)
        return InferResponse(
            model_name=REDACT,
            model_version="1",
            outputs=outputs,
            id=request.id,
            parameters={"edge_where": "device", "edge_faces": redacted.faces, "request_id": rid},
        )

    def _label_of(self, name: str) -> str:
        """The metric label of a requested model: its name when the agent knows it
        (see :meth:`Agent.knows`), else ``unknown`` (a bounded set of labels)."""
        return name if self.agent.knows(name) else "unknown"

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        """The model's metadata (its manifest's tensors); ``version`` as the request
        names it (``""``: the one served).

        Raises:
            BadRequest: the name or the version is malformed.
            ModelNotFoundError: the agent does not have the model, or not that version.
        """
        package = self.agent.package(check_model_name(name))
        wanted = parse_version(version)
        if package is None and name == REDACT and wanted in (None, 1):
            return REDACT_METADATA
        if package is None:
            raise ModelNotFoundError(f"unknown model {name!r}")
        if wanted is not None and wanted != package.version:
            raise ModelNotFoundError(
                f"model {name!r} has no version {wanted} on this device "
                f"(it serves version {package.version})"
            )
        local = self.agent.loaded().get(name)
        return {
            "name": name,
            "versions": [str(package.version)],
            "platform": _platform(local["variant"]) if local else "",
            "inputs": [spec.to_dict() for spec in package.inputs],
            "outputs": [spec.to_dict() for spec in package.outputs],
        }


REDACT_METADATA: dict[str, Any] = {
    "name": REDACT,
    "versions": ["1"],
    "platform": "edge-agent",
    # any input names: each picture (a BYTES image file, or a UINT8 HWC tensor) comes back
    "inputs": [{"name": "image", "datatype": "BYTES", "shape": [-1]}],
    "outputs": [
        {"name": "image", "datatype": "BYTES", "shape": [-1]},
        {"name": "faces", "datatype": "INT32", "shape": [1]},
    ],
}


def _redaction(parameters: dict[str, Any], base: Redaction) -> Redaction | None:
    """The redaction a ``redact`` request asks for: ``base`` (the policy's) with its
    ``mode`` and ``mask_scale`` parameters; ``None`` when it asks for none.

    Raises:
        InputError: ``mode`` or ``mask_scale`` is wrong.
    """
    mode, scale = parameters.get("mode"), parameters.get("mask_scale")
    if mode is None and scale is None:
        return None
    try:
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
            raise ValueError(f"mask_scale must be a number, got {scale!r}")
        return replace(
            base,
            mode=base.mode if mode is None else mode,
            mask_scale=base.mask_scale if scale is None else float(scale),
        )
    except (TypeError, ValueError) as exc:
        raise InputError(f"{REDACT}: {exc}"[:200]) from None


def _asked_for(
    outputs: dict[str, Any], wanted: list[RequestedOutput] | None, of: str
) -> dict[str, Any]:
    """The outputs a request names, in its order (all when it names none).

    Raises:
        InputError: it names one there is not (``of``: whose, for the message).
    """
    if wanted is None:
        return outputs
    missing = [o.name for o in wanted if o.name not in outputs]
    if missing:
        raise InputError(f"unknown output {missing[0]!r} {of}")
    return {o.name: outputs[o.name] for o in wanted}


def _platform(variant: str) -> str:
    return "tensorflow_lite" if variant.startswith("tflite") else "onnxruntime_onnx"


def _results(agent: Agent, result: Any, sizes: list[tuple[int, int]] | None) -> Any:
    """The ``results`` output: one JSON document a batch row, what the model's outputs
    mean (a classifier's top labels, a detector's boxes: in the pixels of the pictures
    sent as files, else of the model's input); strict JSON (no NaN).

    Raises:
        InputError: nothing here reads the outputs of the model that answered.
    """
    package = agent.package(result.model)
    rows = per_row(describe_outputs(package, result.outputs, image_hw=sizes)) if package else []
    if not rows:
        raise InputError(
            f"model {result.model!r} answered with outputs nothing here reads: ask for its "
            f"own outputs, not {RESULTS!r}"
        )
    return np.array([json_line(row) for row in rows], dtype=object)
