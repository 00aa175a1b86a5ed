"""The facts the policy decides on, gathered for one request: can the device run
the model and does it fit; latency estimates (local: measured, or predicted from
the variant's cost before its first run; and the cloud's round trip per model) and
the requests already running locally; the time left; heat and load; whether a
gateway is configured, the link is up and the breaker closed. The decision itself
(:func:`edge_agent.policy.decide`) is pure.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from edge_agent.agent.models import LocalModels
from edge_agent.offload.client import OffloadClient
from edge_agent.policy import LatencyEstimate, RequestFacts
from edge_agent.privacy import Findings
from edge_agent.profiles.state import DeviceState

__all__ = ["FactSheet"]

# round-trip estimates kept, one per model the cloud answered (the oldest forgotten)
REMOTE_KEPT = 256


class FactSheet:
    """Gathers :class:`RequestFacts`; keeps the cloud's latency per model."""

    def __init__(
        self,
        models: LocalModels,
        offload: OffloadClient | None,
        *,
        online: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.models = models
        self.offload = offload
        self._online = online
        self._clock = clock
        self._remote: OrderedDict[str, LatencyEstimate] = OrderedDict()
        self._lock = threading.Lock()

    def observe_remote(self, model: str, milliseconds: float) -> None:
        """One round trip to the cloud for ``model`` (answered: the name is one it has)."""
        with self._lock:
            estimate = self._remote.get(model)
            if estimate is None:
                estimate = self._remote[model] = LatencyEstimate()
                while len(self._remote) > REMOTE_KEPT:
                    self._remote.popitem(last=False)
            estimate.observe(milliseconds)

    def remote_ms(self, model: str) -> float | None:
        with self._lock:
            estimate = self._remote.get(model)
            return estimate.value if estimate is not None else None

    def of(
        self,
        model: str,
        label: str | None,
        findings: Findings,
        deadline: float,
        state: DeviceState,
        confidence: float | None = None,
    ) -> RequestFacts:
        package = self.models.package(model)
        variant = self.models.best_variant(package) if package is not None else None
        local = self.models.loaded_model(model)
        return RequestFacts(
            model=model,
            label=label,
            findings=findings.kinds,
            on_device=variant is not None,
            fits_memory=variant is None or local is not None or self.models.fits(variant, model),
            local_ms=local.estimate.value if local is not None else self.models.prior_ms(variant),
            local_queue=local.running if local is not None else 0,
            remote_ms=self.remote_ms(model),
            deadline_ms=(deadline - self._clock()) * 1000,
            throttled=state.throttled,
            critical=state.critical,
            cpu_load=state.cpu_load,
            gateway=self.offload is not None,
            online=self._online(),
            breaker_open=self.offload is not None and self.offload.breaker.is_open,
            local_confidence=confidence,
        )
