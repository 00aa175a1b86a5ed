"""One request on its way through the agent (:class:`Request`), and what answered
it (:class:`AgentResult`, made in one place: :meth:`Request.answer`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_agent.agent.models import Timing
from edge_agent.policy import Decision
from edge_agent.privacy import Findings
from edge_agent.profiles.state import DeviceState
from edge_core.errors import InputError
from edge_core.tensors import format_shape

__all__ = ["AgentResult", "Request", "as_arrays"]

Array = np.ndarray[Any, Any]


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
    wire_bytes: tuple[int, int] | None = None  # answered by the cloud: bytes sent, received

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
        if self.wire_bytes is not None:
            out["bytes_sent"], out["bytes_received"] = self.wire_bytes
        return out


@dataclass
class Request:
    """A request the agent accepted: its inputs as arrays, its label, deadline and
    id, when it started (and how long it waited for a model to load), the
    device's state when it came, and the version asked for (``None``: any)."""

    model: str
    arrays: dict[str, Array]
    label: str | None
    deadline: float
    request_id: str
    timing: Timing
    state: DeviceState
    version: int | None = None

    def answer(
        self,
        decision: Decision,
        outputs: dict[str, Array],
        *,
        where: str,
        model: str,
        version: int | None,
        findings: Findings,
        now: Callable[[], float],
        variant: str | None = None,
        degraded: bool = False,
        cached: bool = False,
        escalated: bool = False,
        error: str | None = None,
        wire_bytes: tuple[int, int] | None = None,
    ) -> AgentResult:
        """The result: ``outputs`` of ``model`` (``version``), answered ``where``."""
        return AgentResult(
            model=model,
            outputs=outputs,
            decision=decision,
            where=where,
            latency_ms=self.timing.latency_ms(now()),
            request_id=self.request_id,
            variant=variant,
            version=version,
            degraded=degraded,
            cached=cached,
            escalated=escalated,
            findings=findings,
            error=error,
            load_ms=self.timing.load_ms,
            wire_bytes=wire_bytes,
        )


def as_arrays(inputs: Mapping[str, Any]) -> dict[str, Array]:
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
