"""The agent's request pipeline: :meth:`Agent.infer` runs the steps of the
package's docstring (:mod:`edge_agent.agent`), each a method of its own; the
state lives with its owner (the models, the facts, the fallback, the stats).

One class, a little over 400 lines: its methods are the pipeline's steps, which
read best in the order they run; everything they keep lives in the other modules.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.agent.facts import FactSheet
from edge_agent.agent.fallback import Fallback, ResultCache, degrade
from edge_agent.agent.models import LocalModel, LocalModels, Timing
from edge_agent.agent.result import AgentResult, Request, as_arrays
from edge_agent.agent.sources import ModelSource
from edge_agent.agent.stats import AgentStats
from edge_agent.offload.client import OffloadClient, fitted
from edge_agent.policy import LABELS, Action, Decision, PolicyRules, Reason, decide
from edge_agent.privacy import Findings, PrivacyInspector, Redacted, Redaction
from edge_agent.profiles.schema import DeviceProfile
from edge_agent.profiles.state import DeviceState, Sampled, read_device_state
from edge_core.errors import (
    DeadlineExceeded,
    EdgeError,
    InputError,
    ModelNotFoundError,
    OffloadError,
    OffloadTimeout,
    OffloadUnavailable,
    PolicyRejected,
    PrivacyRefusal,
)
from edge_core.images import MAX_IMAGE_PIXELS
from edge_core.names import check_model_name
from edge_core.package import ModelPackage
from edge_core.protocol.types import InferRequest, InferResponse
from edge_core.tensors import check_rows, datatype_of

__all__ = ["DEFAULT_POLICY", "Agent"]

DEFAULT_POLICY = Path(__file__).resolve().parent.parent / "policy" / "default.toml"

log = logging.getLogger(__name__)

Array = np.ndarray[Any, Any]

# a refusal because the cloud cannot answer: the fallback's tiers may still
_CLOUD_CANNOT = frozenset(
    {Reason.CLOUD_UNREACHABLE, Reason.NOT_IN_CLOUD, Reason.DEADLINE_REMOTE_TOO_SLOW}
)


class Agent:
    """Answers inference requests on the device or in the cloud, per the policy."""

    def __init__(
        self,
        *,
        profile: DeviceProfile,
        repository: ModelSource,
        rules: PolicyRules,
        offload: OffloadClient | None = None,
        inspector: PrivacyInspector | None = None,
        cache_entries: int = 256,
        deadline_ms: float = 1000.0,
        device_state: Callable[[], DeviceState] | None = None,
        online: Callable[[], bool] = lambda: True,
        root: Path = Path("/"),
        max_rows: int = 32,
        max_pixels: int = MAX_IMAGE_PIXELS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``online`` tells whether the device has a network link at all (e.g. the MQTT
        connection's state); ``device_state`` its heat and load (by default read under
        ``root`` at most once a second). ``max_rows``: the rows one request may hold;
        ``max_pixels``: a picture's, for those who decode one for it (``[limits]``)."""
        self.profile = profile
        self.rules = rules
        self.inspector = inspector or PrivacyInspector(None)
        self.deadline_ms = deadline_ms
        self.models = LocalModels(profile, repository, clock=clock)
        self.stats = AgentStats()
        self.cache = ResultCache(cache_entries)
        self.facts = FactSheet(
            self.models, offload, rules=lambda: self.rules, online=online, clock=clock
        )
        self.fallback = Fallback(
            self.models, rules, self.cache, count=self.stats.decided, clock=clock
        )
        self._device_state = device_state or Sampled(
            lambda: read_device_state(profile, root), clock=clock
        )
        self._clock = clock
        self.max_rows = max_rows
        self.max_pixels = max_pixels
        # the power mode in force, as the service that applies it says (None: none applied)
        self.power_mode: str | None = profile.default_power_mode

    @property
    def offload(self) -> OffloadClient | None:
        """The client that sends requests to the gateway (``None``: local only)."""
        return self.facts.offload

    @offload.setter
    def offload(self, client: OffloadClient | None) -> None:
        self.facts.offload = client

    # -- the models, for callers -----------------------------------------------------------

    def package(self, model: str) -> ModelPackage | None:
        """The package of ``model`` the agent serves (``None``: not on the device)."""
        return self.models.package(model)

    def local_model(self, model: str) -> LocalModel:
        """The loaded local model (loaded and warmed up on first use).

        Raises:
            ModelNotFoundError, NoVariantError: the device cannot run it.
        """
        return self.models.get(model)

    def warm(self, model: str) -> bool:
        """Load and warm up ``model`` now, so that no request pays for it, unless the
        policy keeps it in the cloud. Whether it is loaded (why not is logged)."""
        if self.rules.rule(model).placement == "cloud":
            return False
        try:
            self.local_model(model)
        except EdgeError as exc:
            log.info("%s is not loaded on this device: %s", model, exc)
            return False
        return True

    def reload(self, model: str, package: ModelPackage | None = None) -> None:
        """Swap in a new version of ``model``: see :meth:`LocalModels.reload`. A face
        detector's model opens the privacy checks' eyes again from it (and is loaded
        as a model of its own only if it was one already).

        Raises:
            EdgeError: the new version cannot be loaded (the old one keeps serving).
        """
        if self.inspector.reload(model):
            log.info("the privacy checks now search pictures with the new %s", model)
            if model not in self.models.loaded():
                return
        self.models.reload(model, package)

    def prefer_precision(self, precision: str | None) -> None:
        """Prefer ``precision`` (``int8`` when hot), or the profile's order (``None``)."""
        self.models.prefer_precision(precision)

    def loaded(self) -> dict[str, dict[str, Any]]:
        """The models loaded on the device: their versions and variants."""
        return self.models.loaded()

    def knows(self, model: str) -> bool:
        """Whether ``model`` is one of a bounded set of names: on the device, named by
        the policy, or answered by the cloud before (the labels of its metrics)."""
        return (
            model in self.rules.models
            or self.models.package(model) is not None
            or (self.offload is not None and self.offload.costs.knows(model))
        )

    def backend_of(self, model: str) -> str | None:
        return self.models.backend_of(model)

    def device_state(self) -> DeviceState:
        return self._device_state()

    # -- requests --------------------------------------------------------------------------

    def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        label: str | None = None,
        deadline_ms: float | None = None,
        request_id: str | None = None,
        version: int | None = None,
    ) -> AgentResult:
        """Answer one request.

        Raises:
            BadRequest: the model name breaks the naming rule.
            InputError: the inputs do not fit the model (an empty batch is refused
                before anything runs), or the label is unknown.
            ModelNotFoundError: the device has the model, but not ``version``; or neither
                the device nor the cloud has it.
            PolicyRejected: the policy refuses it (the decision says why).
            PrivacyRefusal: the exit guard refused to let the data leave.
            DeadlineExceeded: the deadline passed before the model could run.
            OffloadError: the cloud failed and no fallback could answer.
        """
        request = self._accept(model, inputs, label, deadline_ms, request_id, version)
        decision, findings = self._decide(request)  # 1-2: decide, look only when it would leave
        self.stats.decided(decision)
        log.debug(
            "request %s for %s: %s (%s)",
            request.request_id,
            model,
            decision.action.value,
            decision.reason,
        )
        if decision.action == Action.REJECT:
            result = self._refuse(request, decision, findings)
        elif decision.action in (Action.LOCAL, Action.LOCAL_DEGRADED):
            result = self._run_here(request, decision, findings)  # 3, and maybe escalate
        else:
            result = self._send(request, decision, findings)  # 3 offload, 4 fall back
        self.stats.answered(
            result.where, result.latency_ms, degraded=result.degraded, cached=result.cached
        )
        return result

    def explain(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        label: str | None = None,
        deadline_ms: float | None = None,
    ) -> tuple[Decision, Findings]:
        """The decision :meth:`infer` would make for this request, and the findings
        behind it. Nothing leaves the device; the local model runs only when the
        decision depends on its answer's confidence (a model that escalates), as
        ``infer`` would run it, and the decision is then the one made knowing the
        confidence (its ``details`` hold the confidence and the first decision)."""
        request = self._accept(model, inputs, label, deadline_ms, None, None)
        package = self.models.package(model)
        findings = self.inspector.inspect(
            request.arrays, package.preprocessing if package else None
        )
        arrays = request.arrays
        facts = self.facts.of(model, label, findings, request.deadline, request.state, None, arrays)
        decision = decide(facts, self.rules)
        confidence = None
        if decision.action == Action.LOCAL and decision.escalate_to is not None:
            local = self.models.get(model, request.timing)
            confidence = _confidence(self.models.run(local, arrays))
            facts = self.facts.of(
                model, label, findings, request.deadline, request.state, confidence, arrays
            )
            second = decide(facts, self.rules)
            details = {"local_confidence": round(confidence, 4), "first": decision.to_dict()}
            decision = replace(second, details={**second.details, **details})
        estimate = self.facts.cloud_estimate(self.facts.cloud_model(model, confidence), arrays)
        if estimate is not None:
            decision = replace(
                decision, details={**decision.details, "cloud_estimate": estimate.to_dict()}
            )
        return decision, findings

    def redact(self, inputs: Mapping[str, Any], redaction: Redaction | None = None) -> Redacted:
        """Every picture in ``inputs`` (a tensor or an encoded image file) with its faces
        hidden, checked by the stronger eye; on the device, nothing offloaded. As
        :meth:`PrivacyInspector.anonymize` (the policy's redaction unless ``redaction``).

        Raises:
            InputError: no input holds a picture, or one cannot be searched.
            PrivacyRefusal: a face is still found after redaction.
        """
        return self.inspector.anonymize(as_arrays(inputs), redaction)

    # -- the steps -------------------------------------------------------------------------

    def _accept(
        self,
        model: str,
        inputs: Mapping[str, Any],
        label: str | None,
        deadline_ms: float | None,
        request_id: str | None,
        version: int | None,
    ) -> Request:
        """The request, checked before anything is looked up or runs.

        Raises:
            BadRequest, InputError, ModelNotFoundError: see :meth:`infer`.
        """
        started = self._clock()
        check_model_name(model)
        if label is not None and label not in LABELS:
            raise InputError(f"unknown label {label!r:.40}; expected one of {', '.join(LABELS)}")
        package = self.models.package(model)
        if version is not None and package is not None and package.version != version:
            raise ModelNotFoundError(
                f"model {model!r} has no version {version} on this device "
                f"(it serves version {package.version})"
            )
        arrays = as_arrays(inputs)
        if package is not None:
            shapes = {name: array.shape for name, array in arrays.items()}
            check_rows(package.inputs, shapes, self.max_rows, "[limits] max_request_rows")
            if package.preprocessing is not None and package.preprocessing.input in shapes:
                package.preprocessing.check_input(shapes[package.preprocessing.input])
        return Request(
            model=model,
            arrays=arrays,
            label=label,
            deadline=started + (deadline_ms or self.deadline_ms) / 1000,
            request_id=request_id or uuid.uuid4().hex,
            timing=Timing(started),
            state=self._device_state(),
            version=version,
        )

    def _decide(
        self, request: Request, confidence: float | None = None
    ) -> tuple[Decision, Findings]:
        """Decide without looking into the data; if the data would leave, look, decide again."""

        def decided(findings: Findings) -> Decision:
            facts = self.facts.of(
                request.model,
                request.label,
                findings,
                request.deadline,
                request.state,
                confidence,
                request.arrays,
            )
            return decide(facts, self.rules)

        findings = Findings()
        decision = decided(findings)
        if decision.leaves_device:
            package = self.models.package(decision.model) or self.models.package(request.model)
            findings = self.inspector.inspect(
                request.arrays, package.preprocessing if package else None
            )
            if findings.kinds:
                decision = decided(findings)
        return decision, findings

    def _refuse(self, request: Request, decision: Decision, findings: Findings) -> AgentResult:
        """REJECT: refused, unless the cloud was wanted and cannot answer (unreachable,
        lacking the model, too slow for the deadline), when the fallback's tiers answer as
        they would for a failed offload. A model neither here nor in the cloud is not
        found (a 404, as the gateway would have answered).

        Raises:
            PolicyRejected, ModelNotFoundError: see :meth:`infer`.
        """
        if decision.reason in _CLOUD_CANNOT:
            try:
                return self.fallback.answer(
                    request,
                    decision,
                    OffloadUnavailable(decision.message),
                    findings,
                    reason=decision.reason,
                )
            except OffloadError:
                pass
        if decision.reason == Reason.NOT_IN_CLOUD and self.models.package(request.model) is None:
            raise ModelNotFoundError(f"unknown model {request.model!r}: {decision.message}")
        raise PolicyRejected(f"{decision.reason}: {decision.message}", decision=decision)

    def _run_here(self, request: Request, decision: Decision, findings: Findings) -> AgentResult:
        """LOCAL (or LOCAL_DEGRADED); a model that escalates asks the policy again with
        its answer's confidence, and below the threshold the cloud's model answers."""
        local = self.models.get(request.model, request.timing)
        self._check_deadline(request)
        outputs = self.models.run(local, request.arrays)
        degraded = decision.action == Action.LOCAL_DEGRADED
        if not degraded and decision.escalate_to is not None:
            second, findings = self._decide(request, _confidence(outputs))
            if (second.action, second.reason) != (decision.action, decision.reason):
                decision = second  # what was decided knowing the confidence
                self.stats.decided(second)
            if second.leaves_device:
                try:
                    try:
                        answer = self._offload(request, second, findings, request.deadline)
                    except InputError as exc:  # the cloud's model takes it in another form
                        raise OffloadError(f"{second.model} cannot take this input: {exc}") from exc
                except PrivacyRefusal:
                    raise
                except OffloadError as exc:  # the local answer stands, degraded
                    decision = degrade(second, request.model, exc)
                    self.stats.decided(decision)
                    return self._local_answer(
                        request, decision, outputs, local, findings, True, str(exc)
                    )
                return self._cloud_answer(request, second, answer, findings, escalated=True)
            degraded = second.action == Action.LOCAL_DEGRADED
        return self._local_answer(request, decision, outputs, local, findings, degraded)

    def _send(self, request: Request, decision: Decision, findings: Findings) -> AgentResult:
        """OFFLOAD (or OFFLOAD_REDACTED), keeping time for a local stand-in; when the
        cloud fails, the fallback's tiers answer."""
        self._check_deadline(request)
        try:
            reserve = self.fallback.reserve_s(request.model, request.version, request.timing)
            answer = self._offload(request, decision, findings, request.deadline - reserve)
        except PrivacyRefusal:
            raise
        except OffloadError as exc:
            return self.fallback.answer(request, decision, exc, findings)
        return self._cloud_answer(request, decision, answer, findings)

    def _offload(
        self, request: Request, decision: Decision, findings: Findings, deadline: float
    ) -> InferResponse:
        """Send it to the cloud (a redacted copy when the decision says so), checked
        against the model's inputs first: nothing malformed leaves.

        Raises:
            InputError: the inputs do not fit the cloud's model.
            PrivacyRefusal, OffloadError: see :meth:`OffloadClient.infer`.
        """
        if self.offload is None:
            raise OffloadError("no gateway is configured")
        if self._clock() >= deadline:
            raise OffloadTimeout("no time left for the cloud before the deadline")
        target = self.models.package(decision.model)
        outgoing = InferRequest(
            inputs=request.arrays,
            datatypes={name: datatype_of(a.dtype) for name, a in request.arrays.items()},
            model_name=decision.model,
            model_version=str(request.version)
            if request.version is not None and decision.model == request.model
            else "",
            id=request.request_id,
        )
        if target is not None:  # checked here as the gateway would, cast as the runtime casts
            outgoing = fitted(target.inputs, outgoing, decision.model)
        redacted = decision.action == Action.OFFLOAD_REDACTED
        if redacted:  # checked as the picture will be seen where it goes (a JPEG's)
            arrays, after = self.inspector.redact(
                outgoing.inputs,
                findings,
                target.preprocessing if target else None,
                seen=self.offload.picture_view(target, deadline),
            )
            if after.kinds:
                raise PrivacyRefusal(
                    f"redaction left {', '.join(sorted(after.kinds))} identifiable; not sent"
                )
            outgoing = replace(outgoing, inputs=arrays)
        return self.offload.infer(
            outgoing,
            deadline=deadline,
            label=request.label,
            redacted=redacted,
            request_id=request.request_id,
            package=target,
        )

    def _check_deadline(self, request: Request) -> None:
        """Raises DeadlineExceeded when the request's time is up before its work starts
        (as the gateway fails a request whose deadline passes in its queue)."""
        now = self._clock()
        if now >= request.deadline:
            raise DeadlineExceeded(
                f"the request's deadline passed before {request.model!r} could run "
                f"({request.timing.latency_ms(now):.3f} ms in)"
            )

    def _local_answer(
        self,
        request: Request,
        decision: Decision,
        outputs: dict[str, Array],
        local: LocalModel,
        findings: Findings,
        degraded: bool,
        error: str | None = None,
    ) -> AgentResult:
        return request.answer(
            decision,
            outputs,
            where="device",
            model=request.model,
            version=local.package.version,
            variant=local.variant.id,
            findings=findings,
            degraded=degraded,
            error=error,
            now=self._clock,
        )

    def _cloud_answer(
        self,
        request: Request,
        decision: Decision,
        answer: InferResponse,
        findings: Findings,
        *,
        escalated: bool = False,
    ) -> AgentResult:
        outputs = answer.outputs
        # kept to stand in when the cloud fails again (after the local stand-ins, which
        # would answer a local answer's input again themselves): hashing every local
        # request's input (an image: ~0.2 ms) would be waste
        self.cache.put(ResultCache.key(decision.model, request.arrays), outputs)
        package = self.models.package(decision.model)
        return request.answer(
            decision,
            outputs,
            where="cloud",
            model=decision.model,
            version=package.version if package is not None else None,
            findings=findings,
            escalated=escalated,
            now=self._clock,
            wire_bytes=answer.wire_bytes,
        )

    def close(self) -> None:
        self.models.close()
        if self.offload is not None:
            self.offload.close()


def _confidence(outputs: dict[str, Array]) -> float:
    """The least confident row's top score, of the model's first output."""
    scores = next(iter(outputs.values()))
    return float(scores.reshape(len(scores), -1).max(axis=-1).min())
