"""The facts the policy decides on, gathered for one request: can the device run
the model and does it fit; latency estimates (local: measured, or predicted from
the variant's cost before its first run; and the cloud's: the link's round trip, the
request's bytes over its bandwidth and the gateway's time for the model) and the
requests already running locally; the time left; heat and load; whether a gateway is
configured, the link is up and the breaker closed, and the models the cloud lacks.
The decision itself (:func:`edge_agent.policy.decide`) is pure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from edge_agent.agent.models import LocalModels
from edge_agent.offload.client import OffloadClient
from edge_agent.offload.costs import CloudEstimate
from edge_agent.policy import PolicyRules, RequestFacts
from edge_agent.privacy import Findings
from edge_agent.profiles.state import DeviceState

__all__ = ["FactSheet"]

Array = np.ndarray[Any, Any]


class FactSheet:
    """Gathers :class:`RequestFacts`; the cloud's side comes from the offload client
    (what the link and each model's offloads cost, what the cloud lacks)."""

    def __init__(
        self,
        models: LocalModels,
        offload: OffloadClient | None,
        *,
        rules: Callable[[], PolicyRules],
        online: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.models = models
        self.offload = offload
        self.rules = rules
        self._online = online
        self._clock = clock

    def cloud_model(self, model: str, confidence: float | None) -> str:
        """The model the cloud would answer with: the one asked, or after a local answer
        (``confidence`` known), the one it escalates to."""
        escalate_to = self.rules().rule(model).escalate_to
        return escalate_to if confidence is not None and escalate_to else model

    def cloud_estimate(self, model: str, arrays: Mapping[str, Array]) -> CloudEstimate | None:
        """What offloading ``arrays`` to the cloud's ``model`` is expected to take."""
        if self.offload is None:
            return None
        package = self.models.package(model)
        picture = package is not None and package.preprocessing is not None
        # in the datatypes that leave (a uint8 picture as the FP32 its model takes)
        sizes = {spec.name: spec.dtype.itemsize for spec in package.inputs} if package else {}
        raw = sum(
            a.size * sizes.get(name, a.itemsize) for name, a in arrays.items() if a.dtype != object
        )
        return self.offload.estimate(model, raw, picture=picture)

    def of(
        self,
        model: str,
        label: str | None,
        findings: Findings,
        deadline: float,
        state: DeviceState,
        confidence: float | None = None,
        arrays: Mapping[str, Array] | None = None,
    ) -> RequestFacts:
        package = self.models.package(model)
        variant = self.models.best_variant(package) if package is not None else None
        local = self.models.loaded_model(model)
        offload = self.offload
        cloud = self.cloud_model(model, confidence)
        estimate = self.cloud_estimate(cloud, arrays or {})
        lacks = (
            frozenset(m for m in {model, cloud} if offload.catalog.lacks(m))
            if offload is not None
            else frozenset()
        )
        return RequestFacts(
            model=model,
            label=label,
            findings=findings.kinds,
            on_device=variant is not None,
            fits_memory=variant is None or local is not None or self.models.fits(variant, model),
            local_ms=local.estimate.value if local is not None else self.models.prior_ms(variant),
            local_queue=local.running if local is not None else 0,
            remote_ms=estimate.total_ms if estimate is not None else None,
            remote_parts=_parts(estimate),
            deadline_ms=(deadline - self._clock()) * 1000,
            throttled=state.throttled,
            critical=state.critical,
            cpu_load=state.cpu_load,
            gateway=offload is not None,
            online=self._online(),
            breaker_open=offload is not None and offload.breaker.is_open,
            local_confidence=confidence,
            cloud_lacks=lacks,
        )


def _parts(estimate: CloudEstimate | None) -> str:
    """The cloud estimate's parts, for a person: what the decision's message cites."""
    if estimate is None:
        return ""
    bandwidth = f" at {estimate.bandwidth_mbit_s:.1f} Mbit/s" if estimate.bandwidth_mbit_s else ""
    return (
        f"round trip {estimate.rtt_ms:.1f} ms + {_size(estimate.bytes_up + estimate.bytes_down)}"
        f"{bandwidth} {estimate.transfer_ms:.1f} ms + gateway {estimate.server_ms:.1f} ms"
    )


def _size(nbytes: int) -> str:
    if nbytes >= 1_000_000:
        return f"{nbytes / 1e6:.1f} MB"
    if nbytes >= 1000:
        return f"{nbytes / 1e3:.0f} kB"
    return f"{nbytes} B"
