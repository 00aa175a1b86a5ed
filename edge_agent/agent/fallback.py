"""When the cloud fails (timeout, unreachable, breaker open): fall back in tiers
(from the seed documents), never past the deadline.

1. a local model, marked ``degraded`` (the decision then says
   ``LOCAL_DEGRADED``, ``offload_failed``): the model itself where it may run
   here, else the light model that escalates to it;
2. a cached answer of the cloud for the same input (:class:`ResultCache`, an
   LRU), marked ``cached``;
3. else the error, saying that nothing could stand in.

An offload gets the time left minus what the local stand-in needs
(:meth:`Fallback.reserve_s`), so that the stand-in still has its time.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from edge_agent.agent.models import UNTIMED_LOCAL_MS, LocalModels, Timing
from edge_agent.agent.result import AgentResult, Request
from edge_agent.policy import Action, Decision, PolicyRules, Reason
from edge_agent.privacy import Findings
from edge_core.errors import EdgeError, OffloadError, OffloadRejected

__all__ = ["Fallback", "ResultCache", "degrade"]

log = logging.getLogger(__name__)

Array = np.ndarray[Any, Any]


class ResultCache:
    """The last answers by model and input bytes (LRU, bounded, thread-safe)."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._data: OrderedDict[tuple[str, str], dict[str, Array]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

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


def degrade(
    decision: Decision, name: str, error: OffloadError, reason: str = Reason.OFFLOAD_FAILED
) -> Decision:
    """What was decided when the cloud failed and the local ``name`` answers instead."""
    return Decision(
        action=Action.LOCAL_DEGRADED,
        reason=reason,
        message=f"{decision.message}; but the offload failed ({error}): {name} answers",
        model=name,
        label=decision.label,
    )


class Fallback:
    """The tiers that answer when the cloud cannot."""

    def __init__(
        self,
        models: LocalModels,
        rules: PolicyRules,
        cache: ResultCache,
        *,
        count: Callable[[Decision], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.models = models
        self.rules = rules
        self.cache = cache
        self._count = count
        self._clock = clock

    def stand_ins(self, model: str, version: int | None = None) -> list[str]:
        """Local models that can answer for ``model`` when the cloud cannot: the
        model itself where it may run here, else the light model escalating to it.
        A request for one ``version`` takes only that version of the model itself."""
        names = [model] if self.rules.rule(model).placement != "cloud" else []
        if version is None:
            names += sorted(
                name
                for name, rule in self.rules.models.items()
                if rule.escalate_to == model and rule.placement != "cloud"
            )
        out = []
        for name in names:
            package = self.models.package(name)
            if package is not None and (version is None or package.version == version):
                out.append(name)
        return out

    def reserve_s(self, model: str, version: int | None, timing: Timing) -> float:
        """Seconds to keep for the local fallback of ``model`` (it is loaded now if need be)."""
        for name in self.stand_ins(model, version):
            try:
                local = self.models.get(name, timing)
            except EdgeError:
                continue
            estimate = local.estimate.value or self.models.prior_ms(local.variant)
            return (estimate or UNTIMED_LOCAL_MS) / 1000
        return 0.0

    def answer(
        self,
        request: Request,
        decision: Decision,
        error: OffloadError,
        findings: Findings,
        *,
        reason: str = Reason.OFFLOAD_FAILED,
    ) -> AgentResult:
        """The cloud failed: a local stand-in, else a cached answer, else the error.

        Raises:
            OffloadError: of ``error``'s kind, when nothing could stand in.
        """
        model = request.model
        log.info("request %s: the cloud failed for %s (%s)", request.request_id, model, error)
        for name in self.stand_ins(model, request.version):
            try:
                local = self.models.get(name, request.timing)
                outputs = self.models.run(local, request.arrays)
            except EdgeError:
                continue
            degraded = degrade(decision, name, error, reason)
            self._count(degraded)
            return request.answer(
                degraded,
                outputs,
                where="device",
                model=name,
                version=local.package.version,
                variant=local.variant.id,
                findings=findings,
                degraded=True,
                error=str(error),
                now=self._clock,
            )
        cached = self.cache.get(ResultCache.key(decision.model, request.arrays))
        if cached is not None:
            return request.answer(
                decision,
                cached,
                where="cache",
                model=decision.model,
                version=None,
                findings=findings,
                cached=True,
                degraded=True,
                error=str(error),
                now=self._clock,
            )
        message = f"{error}; and no local model or cached answer for {model!r:.140} could stand in"
        if isinstance(error, OffloadRejected):  # the gateway's verdict stands: keep its status
            raise OffloadRejected(message, status=error.status) from error
        raise type(error)(message) from error
