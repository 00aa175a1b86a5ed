"""What the offload link costs, learnt passively from the agent's own exchanges.

Each answered exchange is one sample: the bytes it took on the wire (both ways), its
whole time, and the time the gateway says it held the request (``edge_server_us``,
which the agent asks for; a metadata lookup is taken as held no time). What is left,
the network's share, is modelled as a round trip plus the bytes over the bandwidth:

    network = rtt + bytes x seconds_per_byte

- ``rtt``: the least network time of the recent small exchanges (at most
  :data:`SMALL_BYTES`: a metadata lookup, a classifier's tensor), which are all round
  trip; without any, the least of the recent samples less their bytes' transfer;
- ``seconds_per_byte``: from samples of at least :data:`TRANSFER_BYTES`, a moving
  average (weight :data:`WEIGHT`: after a change it follows within a few exchanges;
  after five, 1/32 of the old value is left) of each one's ``(network - rtt) / bytes``.
  Averaging the time per byte, not the bandwidth, makes the estimate fall at once when
  the link slows, which is what a deadline cares about.

A sample without the gateway's time teaches nothing it can trust and is left out. An
estimate whose newest sample is older than :data:`STALE_S` is no estimate: the link may
have changed since, and the next request that would go is let go, to learn it again
(a link judged too slow is otherwise never tried again). Bounded: a few numbers and
windows of :data:`WINDOW` samples, whatever the traffic.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["LinkEstimate", "LinkEstimator"]

WINDOW = 16  # samples kept for the round trip
SMALL_BYTES = 4 * 1024  # an exchange this small is all round trip
TRANSFER_BYTES = 16 * 1024  # a sample this large says something about the bandwidth
WEIGHT = 0.5  # of the newest sample in the time per byte
STALE_S = 30.0


@dataclass(frozen=True)
class LinkEstimate:
    """The expected network time of an exchange of ``bytes``, in parts."""

    rtt_ms: float
    transfer_ms: float
    bytes: int
    bandwidth_mbit_s: float | None  # None: no sample large enough yet

    @property
    def network_ms(self) -> float:
        return self.rtt_ms + self.transfer_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "rtt_ms": round(self.rtt_ms, 3),
            "transfer_ms": round(self.transfer_ms, 3),
            "bytes": self.bytes,
            "bandwidth_mbit_s": None
            if self.bandwidth_mbit_s is None
            else round(self.bandwidth_mbit_s, 3),
        }


class LinkEstimator:
    """One link's round trip and bandwidth (thread-safe)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._small: deque[float] = deque(maxlen=WINDOW)  # network seconds of small exchanges
        self._samples: deque[tuple[int, float]] = deque(maxlen=WINDOW)  # (bytes, network s)
        self._seconds_per_byte: float | None = None
        self._newest = float("-inf")
        self._lock = threading.Lock()
        self.samples = 0

    def observe(self, nbytes: int, total_s: float, server_s: float | None) -> None:
        """One answered exchange: ``nbytes`` both ways, ``total_s`` from send to answer,
        ``server_s`` the gateway's share (``None``: unknown, the sample is left out)."""
        if server_s is None or nbytes < 0 or total_s < 0:
            return
        network = max(total_s - server_s, 0.0)
        with self._lock:
            self.samples += 1
            self._newest = self._clock()
            self._samples.append((nbytes, network))
            if nbytes <= SMALL_BYTES:
                self._small.append(network)
            if nbytes >= TRANSFER_BYTES:
                per_byte = max(network - self._rtt(), 0.0) / nbytes
                old = self._seconds_per_byte
                self._seconds_per_byte = (
                    per_byte if old is None else WEIGHT * per_byte + (1 - WEIGHT) * old
                )

    def _rtt(self) -> float:
        if self._small:
            return min(self._small)
        per_byte = self._seconds_per_byte or 0.0
        return max(min(network - nbytes * per_byte for nbytes, network in self._samples), 0.0)

    def estimate(self, nbytes: int) -> LinkEstimate | None:
        """The network time to expect for ``nbytes`` (``None``: no recent sample)."""
        with self._lock:
            if not self._samples or self._clock() - self._newest > STALE_S:
                return None
            rtt = self._rtt()
            per_byte = self._seconds_per_byte
        return LinkEstimate(
            rtt_ms=rtt * 1000,
            transfer_ms=nbytes * (per_byte or 0.0) * 1000,
            bytes=nbytes,
            bandwidth_mbit_s=None if not per_byte else 8 / per_byte / 1e6,
        )
