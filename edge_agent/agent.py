"""The agent: runtime, policy, privacy, offload and fallback, tied together.

``agent.infer(model, inputs, label=..., deadline_ms=...)`` does, per request:

1. gather the facts (can the device run the model and does it fit; latency
   estimates, and the requests already running on the local model; the time
   left; heat and load; link and breaker state) and ask
   the pure policy (:func:`edge_agent.policy.decide`) where to run;
2. when the answer would leave the device, inspect the inputs first (faces in
   pictures, personal data in text) and ask again with the findings (findings
   only ever make a request stricter, so a request that stays here needs no
   inspection);
3. run it: locally (and, for a model that escalates, ask the policy again
   with the local answer's confidence); or offload (a redacted copy when the
   label says so), through the exit guard;
4. when the cloud fails (timeout, unreachable, breaker open), fall back in
   tiers (from the seed documents): a local model, marked ``degraded`` (the
   decision then says ``LOCAL_DEGRADED``, ``offload_failed``, also when an
   escalation failed and the light model's own answer stands); a cached answer
   for the same input, marked ``cached``; else a clear error.
   Never past the deadline: an offload gets the time left minus what the
   local fallback needs.

A result's latency is the request's own time; loading and warming up a model
on its first use is reported apart (``load_ms``).

Models come from a :class:`ModelSource`: the models installed over the air
(decrypted into memory) before the bundled ones. :meth:`Agent.reload` swaps a
model in without failing the requests running on the old one.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edge_agent.errors import (
    EdgeError,
    InputError,
    ModelNotFoundError,
    NoVariantError,
    OffloadError,
    OffloadUnavailable,
    PolicyRejected,
    PrivacyRefusal,
)
from edge_agent.offload.client import OffloadClient
from edge_agent.package import ModelPackage, Variant
from edge_agent.policy import (
    LABELS,
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
from edge_agent.profiles.state import DeviceState, Sampled, read_device_state
from edge_agent.protocol.types import InferRequest
from edge_agent.runtime import Session, open_best, rank_variants
from edge_agent.runtime.selection import installed_formats
from edge_agent.stats import LatencyWindow
from edge_agent.tensors import datatype_of, format_shape

__all__ = [
    "DEFAULT_POLICY",
    "Agent",
    "AgentResult",
    "LayeredSource",
    "ModelSource",
    "ResultCache",
]

DEFAULT_POLICY = Path(__file__).resolve().parent / "policy" / "default.toml"

log = logging.getLogger(__name__)

Array = np.ndarray[Any, Any]
# A loaded model holds about its file's size once more in the runtime's own structures.
MEMORY_FACTOR = 2.0
# What the local fallback is assumed to need before it has been timed.
UNTIMED_LOCAL_MS = 50.0


class ModelSource(Protocol):
    """Where the agent's models come from."""

    def get(self, name: str) -> ModelPackage:
        """The package to run for ``name``. Raises ``ModelNotFoundError``."""
        ...


class LayeredSource:
    """The first source that has a model: e.g. updates installed over the air, then
    the bundled models."""

    def __init__(self, sources: Sequence[ModelSource]) -> None:
        self.sources = list(sources)

    def get(self, name: str) -> ModelPackage:
        for source in self.sources:
            try:
                return source.get(name)
            except ModelNotFoundError:
                continue
        raise ModelNotFoundError(f"unknown model {name!r}")


@dataclass
class AgentResult:
    """What answered a request, how, and why."""

    model: str
    outputs: dict[str, Array]
    decision: Decision
    where: str  # "device", "cloud" or "cache"
    latency_ms: float  # the request's own time: loading a model for it is in load_ms
    request_id: str
    variant: str | None = None
    version: int | None = None
    degraded: bool = False
    cached: bool = False
    escalated: bool = False
    findings: Findings | None = None
    error: str | None = None  # why the preferred path failed, when a fallback answered
    load_ms: float | None = None  # loading and warming up a model first, when this request did

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model,
            "version": self.version,
            "where": self.where,
            "variant": self.variant,
            "degraded": self.degraded,
            "cached": self.cached,
            "escalated": self.escalated,
            "latency_ms": round(self.latency_ms, 4),
            "request_id": self.request_id,
            **self.decision.to_dict(),
        }
        if self.load_ms is not None:
            out["load_ms"] = round(self.load_ms, 2)
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
    package: ModelPackage
    variant: Variant
    session: Session
    estimate: LatencyEstimate = field(default_factory=LatencyEstimate)
    running: int = 0  # requests running on it now (the queue ahead of the next one)


@dataclass
class _Timing:
    """When a request started, and how long it waited for models to load: its
    latency is its own time, without loading and warming up a model."""

    started: float
    load_s: float = 0.0

    def latency_ms(self, now: float) -> float:
        return (now - self.started - self.load_s) * 1000

    @property
    def load_ms(self) -> float | None:
        return self.load_s * 1000 if self.load_s > 0 else None


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``online`` tells whether the device has a network link at all (e.g. the MQTT
        connection's state); ``device_state`` its heat and load (by default read under
        ``root`` at most once a second)."""
        self.profile = profile
        self.repository = repository
        self.rules = rules
        self.offload = offload
        self.inspector = inspector or PrivacyInspector(None)
        self.cache = ResultCache(cache_entries)
        self.deadline_ms = deadline_ms
        self.counter = DecisionCounter()
        self._device_state = device_state or Sampled(
            lambda: read_device_state(profile, root), clock=clock
        )
        self._online = online
        self._clock = clock
        self._local: dict[str, _Local] = {}
        self._loading: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._packages: dict[str, ModelPackage | None] = {}
        self._best: dict[tuple[str, int, tuple[str, ...]], tuple[ModelPackage, Variant | None]] = {}
        self._remote: dict[str, LatencyEstimate] = {}
        self.degraded = 0
        self.cached_answers = 0
        self.latency = LatencyWindow()
        self.power_mode = profile.default_power_mode
        self._precision: str | None = None  # preferred over the profile's order (when hot)

    # -- models on the device ------------------------------------------------------------

    def package(self, model: str) -> ModelPackage | None:
        """The package of ``model`` the agent serves (cached; ``None``: not on the device).

        The cached copy carries the manifest only: a package decrypted into
        memory does not stay there twice.
        """
        with self._lock:
            if model in self._packages:
                return self._packages[model]
        try:
            package: ModelPackage | None = self.repository.get(model)
        except ModelNotFoundError:
            package = None
        if package is not None and package.contents is not None:
            package = replace(package, contents={})
        with self._lock:
            self._packages[model] = package
        return package

    def _best_variant(self, package: ModelPackage) -> Variant | None:
        """The variant this device would run (remembered per package and precision
        order: the policy asks on every request)."""
        precisions = self.precisions
        key = (package.name, package.version, precisions)
        known = self._best.get(key)
        if known is not None and known[0] is package:
            return known[1]
        try:
            best: Variant | None = rank_variants(
                package,
                precisions=precisions,
                formats=self.profile.formats,
                installed=installed_formats(),
            )[0]
        except NoVariantError:
            best = None
        self._best[key] = (package, best)
        return best

    def _fits(self, variant: Variant, model: str) -> bool:
        used = (
            sum(local.variant.size for name, local in self._local.items() if name != model)
            * MEMORY_FACTOR
        )
        needed = variant.size * MEMORY_FACTOR
        return used + needed <= self.profile.memory_budget_mb * 1024 * 1024

    def _load(self, package: ModelPackage) -> _Local:
        variant, session = open_best(
            package,
            self.profile.runtime,
            precisions=self.precisions,
            formats=self.profile.formats,
            profile_name=f"profile {self.profile.id}",
        )
        local = _Local(
            replace(package, contents={}) if package.contents else package, variant, session
        )
        zeros = {
            spec.name: np.zeros([d if d > 0 else 1 for d in spec.shape], spec.dtype)
            for spec in session.inputs
        }
        self._run_local(local, zeros)  # a first timing, for the deadline arithmetic
        return local

    def local_model(self, model: str) -> _Local:
        """The loaded local model (loaded and warmed up on first use).

        Loading one model does not hold up requests for the others.

        Raises:
            ModelNotFoundError, NoVariantError: the device cannot run it.
        """
        return self._local_model(model, None)

    def _local_model(self, model: str, timing: _Timing | None) -> _Local:
        """:meth:`local_model`; the time spent loading it (or waiting for another
        request to) goes to ``timing``."""
        local = self._local.get(model)
        if local is not None:
            return local
        started = self._clock()
        try:
            with self._lock:
                lock = self._loading.setdefault(model, threading.Lock())
            with lock:
                local = self._local.get(model)
                if local is None:
                    local = self._local[model] = self._load(self.repository.get(model))
                return local
        finally:
            if timing is not None:
                timing.load_s += self._clock() - started

    def reload(self, model: str, package: ModelPackage | None = None) -> None:
        """Swap in a new version of ``model`` (e.g. just installed over the air).

        The new version is loaded and warmed up first; requests already running
        finish on the old one, which is then dropped. Nothing fails meanwhile.
        """
        fresh = self._load(package or self.repository.get(model))
        with self._lock:
            self._packages[model] = fresh.package
            self._local[model] = fresh
            for key in list(self._best):  # a copy: requests may add to it meanwhile
                if key[0] == model and key[1] != fresh.package.version:
                    self._best.pop(key, None)  # a version no longer served
        log.info("now serving %s (%s)", fresh.package.qualified_name, fresh.variant.id)

    @property
    def precisions(self) -> tuple[str, ...]:
        """The precision order in force: the profile's, or a preferred one first."""
        if self._precision is None:
            return self.profile.precisions
        rest = tuple(p for p in self.profile.precisions if p != self._precision)
        return (self._precision, *rest)

    def prefer_precision(self, precision: str | None) -> None:
        """Prefer ``precision`` (``int8`` when the device runs hot), or go back to the
        profile's order (``None``). Loaded models whose best variant changes are
        reloaded, the new variant warmed up before it takes over."""
        self._precision = precision
        for name, local in list(self._local.items()):
            best = self._best_variant(local.package)
            if best is not None and best.id != local.variant.id:
                try:
                    self.reload(name)
                except EdgeError as exc:
                    log.warning("cannot switch %s to %s: %s", name, best.id, exc)

    def backend_of(self, model: str) -> str | None:
        local = self._local.get(model)
        return local.session.backend if local is not None else None

    def _stand_ins(self, model: str) -> list[str]:
        """Local models that can answer for ``model`` when the cloud cannot: the
        model itself where it may run here, else the light model escalating to it."""
        names = [model] if self.rules.rule(model).placement != "cloud" else []
        names += sorted(
            name
            for name, rule in self.rules.models.items()
            if rule.escalate_to == model and rule.placement != "cloud"
        )
        return [name for name in names if self.package(name) is not None]

    def _reserve(self, model: str, timing: _Timing) -> float:
        """Seconds to keep for the local fallback of ``model`` (it is loaded now if need be)."""
        for name in self._stand_ins(model):
            try:
                local = self._local_model(name, timing)
            except EdgeError:
                continue
            return (local.estimate.value or UNTIMED_LOCAL_MS) / 1000
        return 0.0

    # -- the decision --------------------------------------------------------------------

    def _facts(
        self,
        model: str,
        label: str | None,
        findings: Findings,
        deadline: float,
        state: DeviceState,
        confidence: float | None = None,
    ) -> RequestFacts:
        package = self.package(model)
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
            local_queue=local.running if local is not None else 0,
            remote_ms=remote.value if remote is not None else None,
            deadline_ms=(deadline - self._clock()) * 1000,
            throttled=state.throttled,
            critical=state.critical,
            cpu_load=state.cpu_load,
            gateway=self.offload is not None,
            online=self._online(),
            breaker_open=self.offload is not None and self.offload.breaker.is_open,
            local_confidence=confidence,
        )

    @staticmethod
    def _arrays(inputs: Mapping[str, Any]) -> dict[str, Array]:
        """The inputs as arrays; an empty batch is refused before anything runs.

        Raises:
            InputError: an input has no rows, or is not an array (a ragged list).
        """
        arrays = {}
        for name, value in inputs.items():
            try:
                arrays[name] = np.asarray(value)
            except ValueError as exc:  # e.g. [[1, 2], [3]]
                raise InputError(
                    f"input {name!r} is not a tensor: {exc} (expected rows of equal length)"
                ) from None
        for name, array in arrays.items():
            if array.ndim >= 1 and array.shape[0] == 0:
                raise InputError(
                    f"input {name!r} is an empty batch (shape {format_shape(array.shape)}): "
                    "at least one row is expected"
                )
        return arrays

    @staticmethod
    def _check_label(label: str | None) -> None:
        if label is not None and label not in LABELS:
            raise InputError(f"unknown label {label!r}; expected one of {', '.join(LABELS)}")

    def explain(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        label: str | None = None,
        deadline_ms: float | None = None,
    ) -> tuple[Decision, Findings]:
        """The decision for this request and the findings behind it, without running a model."""
        self._check_label(label)
        arrays = self._arrays(inputs)
        package = self.package(model)
        findings = self.inspector.inspect(arrays, package.preprocessing if package else None)
        deadline = self._clock() + (deadline_ms or self.deadline_ms) / 1000
        facts = self._facts(model, label, findings, deadline, self._device_state())
        return decide(facts, self.rules), findings

    def _decide(
        self,
        model: str,
        arrays: dict[str, Array],
        label: str | None,
        deadline: float,
        state: DeviceState,
        confidence: float | None = None,
    ) -> tuple[Decision, Findings]:
        """Decide without looking into the data; if the data would leave, look, decide again."""
        findings = Findings()
        decision = decide(
            self._facts(model, label, findings, deadline, state, confidence), self.rules
        )
        if decision.leaves_device:
            package = self.package(decision.model) or self.package(model)
            findings = self.inspector.inspect(arrays, package.preprocessing if package else None)
            if findings.kinds:
                facts = self._facts(model, label, findings, deadline, state, confidence)
                decision = decide(facts, self.rules)
        return decision, findings

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
            InputError: the inputs do not fit the model (an empty batch is refused
                before anything runs), or the label is unknown.
            OffloadError: the cloud failed and no fallback could answer.
        """
        result = self._infer(model, inputs, label, deadline_ms, request_id)
        self.latency.observe(result.where, result.latency_ms)
        return result

    def _infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        label: str | None,
        deadline_ms: float | None,
        request_id: str | None,
    ) -> AgentResult:
        started = self._clock()
        timing = _Timing(started)
        self._check_label(label)
        arrays = self._arrays(inputs)
        request_id = request_id or uuid.uuid4().hex
        deadline = started + (deadline_ms or self.deadline_ms) / 1000
        state = self._device_state()
        decision, findings = self._decide(model, arrays, label, deadline, state)
        self.counter.count(decision)
        log.debug(
            "request %s for %s: %s (%s)", request_id, model, decision.action.value, decision.reason
        )

        def result(
            outputs: dict[str, Array], where: str, answered_by: str, **extra: Any
        ) -> AgentResult:
            if where == "cloud":
                # kept to stand in when the cloud fails again (after the local stand-ins,
                # which would answer a local answer's input again themselves): hashing
                # every local request's input (an image: ~0.2 ms) would be waste
                self.cache.put(ResultCache.key(answered_by, arrays), outputs)
            package = self.package(answered_by)
            return AgentResult(
                model=answered_by,
                outputs=outputs,
                decision=decision,
                where=where,
                latency_ms=timing.latency_ms(self._clock()),
                request_id=request_id,
                version=package.version if package is not None else None,
                findings=findings,
                load_ms=timing.load_ms,
                **extra,
            )

        if decision.action == Action.REJECT:
            if decision.reason == "cloud_unreachable":  # as when an offload fails: a stand-in
                try:
                    return self._fall_back(
                        decision, model, arrays, OffloadUnavailable(decision.message), timing,
                        request_id, findings, reason=decision.reason,
                    )  # fmt: skip
                except OffloadError:
                    pass
            raise PolicyRejected(f"{decision.reason}: {decision.message}", decision=decision)
        if decision.action in (Action.LOCAL, Action.LOCAL_DEGRADED):
            local = self._local_model(model, timing)
            outputs = self._run_local(local, arrays)
            degraded = decision.action == Action.LOCAL_DEGRADED
            if degraded:
                self.degraded += 1
            elif decision.escalate_to is not None:
                scores = next(iter(outputs.values()))
                confidence = float(scores.reshape(len(scores), -1).max(axis=-1).min())
                second, findings = self._decide(model, arrays, label, deadline, state, confidence)
                if (second.action, second.reason) != (decision.action, decision.reason):
                    decision = second  # what was decided knowing the confidence
                    self.counter.count(second)
                if second.leaves_device:
                    try:
                        answer = self._offload(
                            second, arrays, findings, label, deadline, request_id
                        )
                        return result(answer, "cloud", second.model, escalated=True)
                    except PrivacyRefusal:
                        raise
                    except OffloadError as exc:  # the local answer stands, degraded
                        decision = self._degrade(second, model, exc)
                        self.degraded += 1
                        self.counter.count(decision)
                        return result(
                            outputs,
                            "device",
                            model,
                            variant=local.variant.id,
                            degraded=True,
                            error=str(exc),
                        )
                if second.action == Action.LOCAL_DEGRADED:
                    self.degraded += 1
                    degraded = True
            return result(outputs, "device", model, variant=local.variant.id, degraded=degraded)

        # OFFLOAD or OFFLOAD_REDACTED
        try:
            reserve = self._reserve(model, timing)
            outputs = self._offload(
                decision, arrays, findings, label, deadline - reserve, request_id
            )
            return result(outputs, "cloud", decision.model)
        except PrivacyRefusal:
            raise
        except OffloadError as exc:
            return self._fall_back(decision, model, arrays, exc, timing, request_id, findings)

    def _run_local(self, local: _Local, arrays: dict[str, Array]) -> dict[str, Array]:
        with self._lock:
            local.running += 1
        started = self._clock()
        try:
            outputs = local.session.run(arrays)
        finally:
            with self._lock:
                local.running -= 1
        local.estimate.observe((self._clock() - started) * 1000)
        return outputs

    @staticmethod
    def _degrade(
        decision: Decision, name: str, error: OffloadError, reason: str = "offload_failed"
    ) -> Decision:
        """What was decided when the cloud failed and the local ``name`` answers instead."""
        return Decision(
            action=Action.LOCAL_DEGRADED,
            reason=reason,
            message=f"{decision.message}; but the offload failed ({error}): {name} answers",
            model=name,
            label=decision.label,
        )

    def _offload(
        self,
        decision: Decision,
        arrays: dict[str, Array],
        findings: Findings,
        label: str | None,
        deadline: float,
        request_id: str,
    ) -> dict[str, Array]:
        if self.offload is None:
            raise OffloadError("no gateway is configured")
        redacted = decision.action == Action.OFFLOAD_REDACTED
        if redacted:
            package = self.package(decision.model)
            arrays, after = self.inspector.redact(
                arrays, findings, package.preprocessing if package else None
            )
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
            request, deadline=deadline, label=label, redacted=redacted, request_id=request_id
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
        timing: _Timing,
        request_id: str,
        findings: Findings,
        *,
        reason: str = "offload_failed",
    ) -> AgentResult:
        """The cloud failed: a local stand-in, else a cached answer, else the error."""
        log.info("request %s: the cloud failed for %s (%s)", request_id, model, error)
        for name in self._stand_ins(model):
            try:
                local = self._local_model(name, timing)
                outputs = self._run_local(local, arrays)
            except EdgeError:
                continue
            degraded = self._degrade(decision, name, error, reason)
            self.degraded += 1
            self.counter.count(degraded)
            return AgentResult(
                model=name,
                outputs=outputs,
                decision=degraded,
                where="device",
                latency_ms=timing.latency_ms(self._clock()),
                request_id=request_id,
                variant=local.variant.id,
                version=local.package.version,
                degraded=True,
                findings=findings,
                error=str(error),
                load_ms=timing.load_ms,
            )
        cached = self.cache.get(ResultCache.key(decision.model, arrays))
        if cached is not None:
            self.cached_answers += 1
            return AgentResult(
                model=decision.model,
                outputs=cached,
                decision=decision,
                where="cache",
                latency_ms=timing.latency_ms(self._clock()),
                request_id=request_id,
                cached=True,
                degraded=True,
                findings=findings,
                error=str(error),
                load_ms=timing.load_ms,
            )
        raise type(error)(
            f"{error}; and no local model or cached answer for {model!r} could stand in"
        ) from error

    def loaded(self) -> dict[str, dict[str, Any]]:
        """The models loaded on the device: their versions and variants."""
        with self._lock:
            local = dict(self._local)
        return {
            name: {"version": entry.package.version, "variant": entry.variant.id}
            for name, entry in sorted(local.items())
        }

    def device_state(self) -> DeviceState:
        return self._device_state()

    def close(self) -> None:
        for local in list(self._local.values()):
            local.session.close()
        if self.offload is not None:
            self.offload.close()
