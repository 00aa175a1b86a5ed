"""What the offload link costs, learnt passively from the agent's own exchanges.

Each answered exchange is one sample: the bytes it took on the wire (both ways), its
time on the wire (the attempt that was answered), and the time the gateway says it
held the request (``edge_server_us``, which the agent asks for; a metadata lookup is
taken as held no time). What is left, the network's share, is modelled as a round trip
plus the bytes over the bandwidth:

    network = rtt + bytes x seconds_per_byte

- ``rtt``: the least network time of the recent small exchanges (at most
  :data:`SMALL_BYTES`: a metadata lookup, a classifier's tensor), which are all round
  trip. Without any (MQTT asks nothing), a line is fitted through the recent samples
  when their sizes differ enough to tell the two parts apart; else the least network
  time stands for the round trip and nothing is said of the bandwidth (an exchange of
  the same size is still priced right).
- ``seconds_per_byte``: from samples of at least :data:`TRANSFER_BYTES`, a moving
  average (weight :data:`WEIGHT`: after a change it follows within a few exchanges;
  after five, 1/32 of the old value is left) of each one's ``(network - rtt) / bytes``.
  Averaging the time per byte, not the bandwidth, makes the estimate fall at once when
  the link slows, which is what a deadline cares about.

A sample without the gateway's time teaches nothing it can trust and is left out. An
estimate older than :data:`STALE_S` is no estimate: the round trip's newest sample, or
for an exchange of :data:`TRANSFER_BYTES` or more the bandwidth's; the link may have
changed since, and the next request that would go is let go, to learn it again (a link
judged too slow would otherwise never be tried again). Bounded: a few numbers and
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
SPREAD = 1.5  # sizes that differ this much tell a round trip from a transfer


@dataclass(frozen=True)
class LinkEstimate:
    """The expected network time of an exchange of ``bytes``, in parts."""

    rtt_ms: float
    transfer_ms: float
    bytes: int
    bandwidth_mbit_s: float | None  # None: not known (no sample tells it apart)

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
        self._newest_transfer = float("-inf")
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
            rtt = self._known_rtt()
            if nbytes >= TRANSFER_BYTES and rtt is not None:
                per_byte = max(network - rtt, 0.0) / nbytes
                old = self._seconds_per_byte
                self._seconds_per_byte = (
                    per_byte if old is None else WEIGHT * per_byte + (1 - WEIGHT) * old
                )
                self._newest_transfer = self._newest

    def _known_rtt(self) -> float | None:
        """The round trip where the samples tell it apart from the transfer."""
        if self._small:
            return min(self._small)
        fitted = _fit(self._samples)
        return None if fitted is None else fitted[0]

    def estimate(self, nbytes: int) -> LinkEstimate | None:
        """The network time to expect for ``nbytes`` (``None``: no recent sample)."""
        with self._lock:
            now = self._clock()
            if not self._samples or now - self._newest > STALE_S:
                return None
            per_byte = self._seconds_per_byte
            stale = now - self._newest_transfer > STALE_S
            if per_byte is not None and nbytes >= TRANSFER_BYTES and stale:
                return None  # what a transfer takes was learnt too long ago
            rtt = self._known_rtt()
            if rtt is None:  # no sample tells the parts apart: the least time is the trip
                rtt, per_byte = min(network for _, network in self._samples), None
        return LinkEstimate(
            rtt_ms=rtt * 1000,
            transfer_ms=nbytes * (per_byte or 0.0) * 1000,
            bytes=nbytes,
            bandwidth_mbit_s=None if not per_byte else 8 / per_byte / 1e6,
        )


def _fit(samples: deque[tuple[int, float]]) -> tuple[float, float] | None:
    """The round trip and time per byte of a line through the samples (least squares),
    where their sizes differ by :data:`SPREAD` at least and the line makes sense."""
    if len(samples) < 3:
        return None
    sizes = [float(size) for size, _ in samples]
    if min(sizes) <= 0 or max(sizes) < SPREAD * min(sizes):
        return None
    times = [network for _, network in samples]
    mean_size, mean_time = sum(sizes) / len(sizes), sum(times) / len(times)
    spread = sum((s - mean_size) ** 2 for s in sizes)
    slope = sum((s - mean_size) * (t - mean_time) for s, t in zip(sizes, times, strict=True))
    per_byte = slope / spread
    rtt = mean_time - per_byte * mean_size
    if per_byte <= 0 or rtt < 0:
        return None
    return rtt, per_byte
