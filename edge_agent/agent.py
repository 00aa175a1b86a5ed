"""The agent: runtime, policy, privacy, offload and fallback, tied together.

``agent.infer(model, inputs, label=..., deadline_ms=...)`` does, per request:

1. inspect the inputs (faces in pictures, personal data in text);
2. gather the facts (can the device run the model and does it fit; latency
   estimates; the time left; heat and load; link and breaker state) and ask
   the pure policy (:func:`edge_agent.policy.decide`) where to run;
3. run it: locally (and, for a model that escalates, ask the policy again
   with the local answer's confidence); or offload (a redacted copy when the
   label says so), through the exit guard;
4. when the cloud fails (timeout, unreachable, breaker open), fall back in
   tiers (from the seed documents): the local model, marked ``degraded``; a
   cached answer for the same input, marked ``cached``; else a clear error.
   Never past the deadline: an offload gets the time left minus what the
   local fallback needs.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.config import AgentConfig
from edge_agent.errors import (
    EdgeError,
    ModelNotFoundError,
    NoVariantError,
    OffloadError,
    PolicyRejected,
    PrivacyRefusal,
)
from edge_agent.offload.client import OffloadClient
from edge_agent.package import ModelPackage, ModelRepository, Variant
from edge_agent.policy import (
    Action,
    Decision,
    DecisionCounter,
    LatencyEstimate,
    PolicyRules,
    RequestFacts,
    decide,
)
from edge_agent.privacy import Findings, PrivacyInspector
from edge_agent.profiles.schema import DeviceProfile
from edge_agent.profiles.state import DeviceState, read_device_state
from edge_agent.protocol.types import InferRequest
from edge_agent.runtime import Session, open_best, rank_variants
from edge_agent.runtime.selection import installed_formats
from edge_agent.tensors import datatype_of

__all__ = ["DEFAULT_POLICY", "Agent", "AgentResult", "ResultCache", "create_agent"]

DEFAULT_POLICY = Path(__file__).resolve().parent / "policy" / "default.toml"

log = logging.getLogger(__name__)

Array = np.ndarray[Any, Any]
# A loaded model holds about its file's size once more in the runtime's own structures.
MEMORY_FACTOR = 2.0


@dataclass
class AgentResult:
    """What answered a request, how, and why."""

    model: str
    outputs: dict[str, Array]
    decision: Decision
    where: str  # "device", "cloud" or "cache"
    latency_ms: float
    request_id: str
    variant: str | None = None
    degraded: bool = False
    cached: bool = False
    escalated: bool = False
    findings: Findings | None = None
    error: str | None = None  # why the preferred path failed, when a fallback answered

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model,
            "where": self.where,
            "variant": self.variant,
            "degraded": self.degraded,
            "cached": self.cached,
            "escalated": self.escalated,
            "latency_ms": round(self.latency_ms, 4),
            "request_id": self.request_id,
            **self.decision.to_dict(),
        }
        if self.findings is not None:
            out["findings"] = self.findings.to_dict()
        if self.error:
            out["fallback_because"] = self.error
        return out


class ResultCache:
    """The last answers by model and input bytes (LRU, bounded, thread-safe)."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._data: OrderedDict[tuple[str, str], dict[str, Array]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(model: str, inputs: Mapping[str, Array]) -> tuple[str, str]:
        digest = hashlib.sha256()
        for name in sorted(inputs):
            array = np.ascontiguousarray(inputs[name])
            digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
            digest.update(
                array.tobytes() if array.dtype != object else repr(array.tolist()).encode()
            )
        return model, digest.hexdigest()

    def get(self, key: tuple[str, str]) -> dict[str, Array] | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: tuple[str, str], outputs: dict[str, Array]) -> None:
        if self.entries <= 0:
            return
        with self._lock:
            self._data[key] = outputs
            self._data.move_to_end(key)
            while len(self._data) > self.entries:
                self._data.popitem(last=False)


@dataclass
class _Local:
    variant: Variant
    session: Session
    estimate: LatencyEstimate = field(default_factory=LatencyEstimate)


class Agent:
    """Answers inference requests on the device or in the cloud, per the policy."""

    def __init__(
        self,
        *,
        profile: DeviceProfile,
        repository: ModelRepository,
        rules: PolicyRules,
        offload: OffloadClient | None = None,
        inspector: PrivacyInspector | None = None,
        cache_entries: int = 256,
        deadline_ms: float = 1000.0,
        device_state: Callable[[], DeviceState] | None = None,
        root: Path = Path("/"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.profile = profile
        self.repository = repository
        self.rules = rules
        self.offload = offload
        self.inspector = inspector or PrivacyInspector(None)
        self.cache = ResultCache(cache_entries)
        self.deadline_ms = deadline_ms
        self.counter = DecisionCounter()
        self._device_state = device_state or (lambda: read_device_state(profile, root))
        self._clock = clock
        self._local: dict[str, _Local] = {}
        self._local_lock = threading.Lock()
        self._remote: dict[str, LatencyEstimate] = {}
        self.degraded = 0
        self.cached_answers = 0

    # -- models on the device ------------------------------------------------------------

    def package(self, model: str) -> ModelPackage | None:
        """The newest package of ``model`` in the device's repository, if any."""
        return _maybe_package(self.repository, model)

    def _best_variant(self, package: ModelPackage) -> Variant | None:
        try:
            ranked = rank_variants(
                package,
                precisions=self.profile.precisions,
                formats=self.profile.formats,
                installed=installed_formats(),
            )
        except NoVariantError:
            return None
        return ranked[0]

    def _fits(self, variant: Variant, model: str) -> bool:
        used = (
            sum(local.variant.size for name, local in self._local.items() if name != model)
            * MEMORY_FACTOR
        )
        needed = variant.size * MEMORY_FACTOR
        return used + needed <= self.profile.memory_budget_mb * 1024 * 1024

    def local_model(self, model: str) -> _Local:
        """The loaded local model (loaded and warmed up on first use).

        Raises:
            ModelNotFoundError, NoVariantError: the device cannot run it.
        """
        with self._local_lock:
            local = self._local.get(model)
            if local is None:
                package = self.repository.get(model)
                variant, session = open_best(
                    package,
                    self.profile.runtime,
                    precisions=self.profile.precisions,
                    formats=self.profile.formats,
                    profile_name=f"profile {self.profile.id}",
                )
                local = self._local[model] = _Local(variant, session)
            return local

    def backend_of(self, model: str) -> str | None:
        local = self._local.get(model)
        return local.session.backend if local is not None else None

    # -- the decision --------------------------------------------------------------------

    def _facts(
        self,
        model: str,
        package: ModelPackage | None,
        label: str | None,
        findings: Findings,
        deadline: float,
        state: DeviceState,
    ) -> RequestFacts:
        variant = self._best_variant(package) if package is not None else None
        local = self._local.get(model)
        remote = self._remote.get(model)
        return RequestFacts(
            model=model,
            label=label,
            findings=findings.kinds,
            on_device=variant is not None,
            fits_memory=variant is None or local is not None or self._fits(variant, model),
            local_ms=local.estimate.value if local is not None else None,
            remote_ms=remote.value if remote is not None else None,
            deadline_ms=(deadline - self._clock()) * 1000,
            throttled=state.throttled,
            critical=state.critical,
            cpu_load=state.cpu_load,
            gateway=self.offload is not None,
            breaker_open=self.offload is not None and self.offload.breaker.is_open,
        )

    def explain(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        label: str | None = None,
        deadline_ms: float | None = None,
    ) -> tuple[Decision, Findings]:
        """The decision for this request and the findings behind it, without running a model."""
        arrays = {name: np.asarray(value) for name, value in inputs.items()}
        package = self.package(model)
        findings = self.inspector.inspect(arrays, package.preprocessing if package else None)
        deadline = self._clock() + (deadline_ms or self.deadline_ms) / 1000
        facts = self._facts(model, package, label, findings, deadline, self._device_state())
        return decide(facts, self.rules), findings

    # -- requests ------------------------------------------------------------------------

    def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        label: str | None = None,
        deadline_ms: float | None = None,
        request_id: str | None = None,
    ) -> AgentResult:
        """Answer one request.

        Raises:
            PolicyRejected: the policy refuses it (the decision says why).
            InputError: the inputs do not fit the model.
            OffloadError: the cloud failed and no fallback could answer.
        """
        started = self._clock()
        request_id = request_id or uuid.uuid4().hex
        deadline = started + (deadline_ms or self.deadline_ms) / 1000
        arrays = {name: np.asarray(value) for name, value in inputs.items()}
        package = self.package(model)
        pre = package.preprocessing if package is not None else None
        findings = self.inspector.inspect(arrays, pre)
        decision = decide(
            self._facts(model, package, label, findings, deadline, self._device_state()),
            self.rules,
        )
        self.counter.count(decision)
        log.debug(
            "request %s for %s: %s (%s)", request_id, model, decision.action.value, decision.reason
        )

        def result(
            outputs: dict[str, Array], where: str, answered_by: str, **extra: Any
        ) -> AgentResult:
            self.cache.put(ResultCache.key(answered_by, arrays), outputs)
            return AgentResult(
                model=answered_by,
                outputs=outputs,
                decision=decision,
                where=where,
                latency_ms=(self._clock() - started) * 1000,
                request_id=request_id,
                findings=findings,
                **extra,
            )

        if decision.action == Action.REJECT:
            raise PolicyRejected(f"{decision.reason}: {decision.message}", decision=decision)
        if decision.action in (Action.LOCAL, Action.LOCAL_DEGRADED):
            local = self.local_model(model)
            outputs = self._run_local(local, arrays)
            degraded = decision.action == Action.LOCAL_DEGRADED
            if degraded:
                self.degraded += 1
            if decision.escalate_to is not None and not degraded:
                escalated = self._escalate(
                    decision, arrays, outputs, findings, label, deadline, local, request_id
                )
                if escalated is not None:
                    second, answer, error = escalated
                    decision = second
                    self.counter.count(second)
                    if answer is not None:
                        return result(answer, "cloud", second.model, escalated=True)
                    self.degraded += 1
                    return result(
                        outputs,
                        "device",
                        model,
                        variant=local.variant.id,
                        degraded=True,
                        error=error,
                    )
                # confident, or the data may not leave: the local answer stands
            return result(outputs, "device", model, variant=local.variant.id, degraded=degraded)

        # OFFLOAD or OFFLOAD_REDACTED
        try:
            fallback = self._local.get(model) if self.package(model) is not None else None
            reserve = (fallback.estimate.value or 0.0) / 1000 if fallback is not None else 0.0
            outputs = self._offload(
                decision, arrays, findings, label, deadline - reserve, request_id, pre
            )
            return result(outputs, "cloud", decision.model)
        except PrivacyRefusal:
            raise
        except OffloadError as exc:
            return self._fall_back(decision, model, arrays, exc, started, request_id, findings)

    def _run_local(self, local: _Local, arrays: dict[str, Array]) -> dict[str, Array]:
        started = self._clock()
        outputs = local.session.run(arrays)
        local.estimate.observe((self._clock() - started) * 1000)
        return outputs

    def _escalate(
        self,
        first: Decision,
        arrays: dict[str, Array],
        outputs: dict[str, Array],
        findings: Findings,
        label: str | None,
        deadline: float,
        local: _Local,
        request_id: str,
    ) -> tuple[Decision, dict[str, Array] | None, str | None] | None:
        """Ask again with the local answer's confidence; offload when it says so.

        Returns ``None`` when the local answer stands, else the second decision
        with the cloud's answer (or ``None`` and why, when the cloud failed).
        """
        scores = next(iter(outputs.values()))
        confidence = float(np.min(np.max(scores.reshape(len(scores), -1), axis=-1)))
        package = self.package(first.model)
        facts = self._facts(first.model, package, label, findings, deadline, self._device_state())
        second = decide(RequestFacts(**{**vars(facts), "local_confidence": confidence}), self.rules)
        if second.action == Action.LOCAL_DEGRADED:
            return second, None, second.message  # wanted the cloud, cannot reach it
        if not second.leaves_device:
            return None
        target = self.package(second.model)
        try:
            answer = self._offload(
                second,
                arrays,
                findings,
                label,
                deadline,
                request_id,
                target.preprocessing if target else None,
            )
        except OffloadError as exc:
            return second, None, str(exc)
        return second, answer, None

    def _offload(  # the deadline leaves the local fallback the time it needs
        self,
        decision: Decision,
        arrays: dict[str, Array],
        findings: Findings,
        label: str | None,
        deadline: float,
        request_id: str,
        pre: Any,
    ) -> dict[str, Array]:
        if self.offload is None:
            raise OffloadError("no gateway is configured")
        redacted = decision.action == Action.OFFLOAD_REDACTED
        if redacted:
            arrays, after = self.inspector.redact(arrays, findings, pre)
            if after.kinds:
                raise PrivacyRefusal(
                    f"redaction left {', '.join(sorted(after.kinds))} identifiable; not sent"
                )
        request = InferRequest(
            inputs=arrays,
            datatypes={name: datatype_of(a.dtype) for name, a in arrays.items()},
            model_name=decision.model,
            id=request_id,
        )
        started = self._clock()
        response = self.offload.infer(
            request,
            deadline=deadline,
            label=label,
            redacted=redacted,
            request_id=request_id,
        )
        self._remote.setdefault(decision.model, LatencyEstimate()).observe(
            (self._clock() - started) * 1000
        )
        return response.outputs

    def _fall_back(
        self,
        decision: Decision,
        model: str,
        arrays: dict[str, Array],
        error: OffloadError,
        started: float,
        request_id: str,
        findings: Findings,
    ) -> AgentResult:
        """The cloud failed: a local model, else a cached answer, else the error.

        The local stand-in is the model itself when it may run here, else the
        light model that escalates to it (``escalate_to`` in the policy).
        """
        stand_ins = [model] if self.rules.rule(model).placement != "cloud" else []
        stand_ins += sorted(
            name
            for name, rule in self.rules.models.items()
            if rule.escalate_to == model and rule.placement != "cloud"
        )
        for name in stand_ins:
            if self.package(name) is None:
                continue
            try:
                local = self.local_model(name)
                outputs = self._run_local(local, arrays)
            except EdgeError:
                continue
            degraded = Decision(
                action=Action.LOCAL_DEGRADED,
                reason="offload_failed",
                message=f"{decision.message}; but the offload failed ({error}): {name} answers",
                model=name,
                label=decision.label,
            )
            self.degraded += 1
            self.counter.count(degraded)
            return AgentResult(
                model=name,
                outputs=outputs,
                decision=degraded,
                where="device",
                latency_ms=(self._clock() - started) * 1000,
                request_id=request_id,
                variant=local.variant.id,
                degraded=True,
                findings=findings,
                error=str(error),
            )
        cached = self.cache.get(ResultCache.key(decision.model, arrays))
        if cached is not None:
            self.cached_answers += 1
            return AgentResult(
                model=decision.model,
                outputs=cached,
                decision=decision,
                where="cache",
                latency_ms=(self._clock() - started) * 1000,
                request_id=request_id,
                cached=True,
                degraded=True,
                findings=findings,
                error=str(error),
            )
        raise type(error)(
            f"{error}; and no local model or cached answer for {model!r} could stand in"
        ) from error

    def close(self) -> None:
        for local in self._local.values():
            local.session.close()
        if self.offload is not None:
            self.offload.close()


def create_agent(
    config: AgentConfig,
    *,
    device_state: Callable[[], DeviceState] | None = None,
    profile: DeviceProfile | None = None,
) -> Agent:
    """An agent as ``config`` describes it: profile, models, policy, privacy, gateway.

    Raises:
        ConfigError, ProfileError, PolicyError: a configuration file is wrong.
    """
    from edge_agent.offload import ExitGuard, make_transport
    from edge_agent.offload.breaker import CircuitBreaker
    from edge_agent.paths import default_profiles_dir
    from edge_agent.policy import load_policy
    from edge_agent.privacy.faces import FaceDetector
    from edge_agent.profiles import ProfileStore, detect_profile

    if profile is None:
        store = ProfileStore(default_profiles_dir())
        profile = (
            store.get(config.profile)
            if config.profile
            else detect_profile(list(store), config.root).profile
        )
    repository = ModelRepository(config.model_dir)
    rules = load_policy(config.policy or DEFAULT_POLICY)
    detector = None
    if config.face_detector:
        try:
            detector = FaceDetector(repository)
        except EdgeError as exc:
            log.warning("no face detector (%s): pictures cannot be searched for faces", exc)
    inspector = PrivacyInspector(detector)
    offload = None
    if config.gateway is not None:
        gateway = config.gateway
        transport = make_transport(
            gateway.protocol, gateway.address, token=gateway.token, tls=gateway.tls
        )

        def preprocessing(model: str) -> Any:
            package = _maybe_package(repository, model)
            return package.preprocessing if package is not None else None

        offload = OffloadClient(
            transport,
            guard=ExitGuard(inspector, rules, preprocessing=preprocessing),
            breaker=CircuitBreaker(config.breaker.failures, config.breaker.cooldown_s),
            retries=gateway.retries,
        )
    return Agent(
        profile=profile,
        repository=repository,
        rules=rules,
        offload=offload,
        inspector=inspector,
        cache_entries=config.cache_entries,
        deadline_ms=config.deadline_ms,
        device_state=device_state,
        root=config.root,
    )


def _maybe_package(repository: ModelRepository, model: str) -> ModelPackage | None:
    try:
        return repository.get(model)
    except ModelNotFoundError:
        return None
