"""What an offload of a model is expected to cost: the link's round trip, the bytes it
will take over the link's bandwidth, and the gateway's time for the model.

    expected = rtt + (bytes up + bytes down) / bandwidth + gateway time

The link's part is :class:`~edge_agent.offload.link.LinkEstimator`'s; per model, what
its answered offloads took is kept as moving averages (weight :data:`WEIGHT`): the
bytes sent as a share of the request's raw tensors (a picture encoded is a few percent
of its FP32 tensor; a packed map less), the bytes received, and the time the gateway
held it. A model not offloaded yet is priced at its raw bytes (a picture that will
leave encoded at :data:`FIRST_PICTURE_SHARE` of them), and has no gateway time yet:
no estimate, and the first request goes to learn it; so does the first after the
gateway's time for it is older than the link's ``STALE_S``. Bounded: :data:`MODELS`
models (the least recently used forgotten; the totals, :attr:`sent` and
:attr:`received`, are never forgotten).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edge_agent.offload.link import STALE_S, LinkEstimator

__all__ = ["CloudEstimate", "OffloadCosts"]

MODELS = 256
WEIGHT = 0.3
# a JPEG at quality 90 of a 640x480 photograph, against its FP32 tensor (3.7 MB):
# 1/20 to 1/50; priced at the larger until the model's own offloads say
FIRST_PICTURE_SHARE = 0.05


@dataclass(frozen=True)
class CloudEstimate:
    """An offload's expected time, in its parts (what ``policy explain`` shows)."""

    rtt_ms: float
    transfer_ms: float
    server_ms: float
    bytes_up: int
    bytes_down: int
    bandwidth_mbit_s: float | None

    @property
    def total_ms(self) -> float:
        return self.rtt_ms + self.transfer_ms + self.server_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "total_ms": round(self.total_ms, 3),
            "rtt_ms": round(self.rtt_ms, 3),
            "transfer_ms": round(self.transfer_ms, 3),
            "server_ms": round(self.server_ms, 3),
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "bandwidth_mbit_s": None
            if self.bandwidth_mbit_s is None
            else round(self.bandwidth_mbit_s, 3),
        }


@dataclass
class _Model:
    share: float | None = None  # bytes sent / raw bytes
    down: float | None = None  # bytes received
    server_s: float | None = None
    server_at: float = float("-inf")  # when the gateway's time was learnt
    sent: int = 0  # totals, for the counters
    received: int = 0
    answered: int = 0


def _average(old: float | None, new: float) -> float:
    return new if old is None else WEIGHT * new + (1 - WEIGHT) * old


class OffloadCosts:
    """The link and what each model's offloads took (thread-safe)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.link = LinkEstimator(clock=clock)
        self._models: OrderedDict[str, _Model] = OrderedDict()
        self._lock = threading.Lock()
        self.sent = 0  # every model's, never forgotten
        self.received = 0

    def observe(
        self,
        model: str,
        *,
        raw_bytes: int,
        sent: int,
        received: int,
        total_s: float,
        server_s: float | None,
    ) -> None:
        """One answered offload of ``model``: its raw tensors' bytes, the bytes it took
        each way on the wire, its whole time and the gateway's share of it."""
        self.link.observe(sent + received, total_s, server_s)
        with self._lock:
            entry = self._entry(model)
            if raw_bytes > 0:
                entry.share = _average(entry.share, sent / raw_bytes)
            entry.down = _average(entry.down, float(received))
            if server_s is not None:
                entry.server_s = _average(entry.server_s, server_s)
                entry.server_at = self._clock()
            entry.sent += sent
            entry.received += received
            entry.answered += 1
            self.sent += sent
            self.received += received

    def _entry(self, model: str) -> _Model:
        entry = self._models.get(model)
        if entry is None:
            entry = self._models[model] = _Model()
            while len(self._models) > MODELS:
                self._models.popitem(last=False)
        self._models.move_to_end(model)
        return entry

    def expected_bytes(self, model: str, raw_bytes: int, *, picture: bool) -> tuple[int, int]:
        """The bytes an offload of ``model`` with ``raw_bytes`` of tensors is expected to
        send and receive."""
        with self._lock:
            entry = self._models.get(model)
            share = entry.share if entry is not None else None
        if share is None:
            share = FIRST_PICTURE_SHARE if picture else 1.0
        return int(raw_bytes * share), self.expected_down(model)

    def expected_down(self, model: str) -> int:
        """The bytes an answer of ``model`` is expected to take (0: none answered yet)."""
        with self._lock:
            entry = self._models.get(model)
            return int(entry.down or 0) if entry is not None else 0

    def estimate(self, model: str, raw_bytes: int, *, picture: bool) -> CloudEstimate | None:
        """What an offload of ``model`` is expected to take (``None``: the link or the
        gateway's time for it is not known yet)."""
        up, down = self.expected_bytes(model, raw_bytes, picture=picture)
        return self.estimate_bytes(model, up, down)

    def estimate_bytes(self, model: str, up: int, down: int) -> CloudEstimate | None:
        """As :meth:`estimate`, for exchanges of ``up`` and ``down`` bytes."""
        with self._lock:
            entry = self._models.get(model)
            fresh = entry is not None and self._clock() - entry.server_at <= STALE_S
            server_s = entry.server_s if entry is not None and fresh else None
        link = self.link.estimate(up + down)
        if link is None or server_s is None:
            return None
        return CloudEstimate(
            rtt_ms=link.rtt_ms,
            transfer_ms=link.transfer_ms,
            server_ms=server_s * 1000,
            bytes_up=up,
            bytes_down=down,
            bandwidth_mbit_s=link.bandwidth_mbit_s,
        )

    def knows(self, model: str) -> bool:
        """Whether ``model`` was answered by the cloud (a bounded set of names)."""
        with self._lock:
            return model in self._models

    def traffic(self) -> dict[str, dict[str, int]]:
        """Per model: bytes sent and received, and offloads answered."""
        with self._lock:
            return {
                model: {"sent": e.sent, "received": e.received, "answered": e.answered}
                for model, e in self._models.items()
            }
