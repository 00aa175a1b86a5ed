"""A circuit breaker: stop calling a gateway that keeps failing, probe it now and then.

Closed: requests go through; ``failures`` consecutive failures open it. Open:
requests are refused at once (no waiting on a dead link) for ``cooldown_s``.
Then half-open: one probe goes through; its success closes the breaker, its
failure opens it again. Pure state: the clock is passed in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["CircuitBreaker"]


class CircuitBreaker:
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    def __init__(
        self,
        failures: int = 3,
        cooldown_s: float = 5.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = failures
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state = self.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probing = False
        self.opened = 0  # times it opened, for metrics

    @property
    def state(self) -> str:
        with self._lock:
            self._maybe_half_open()
            return self._state

    @property
    def is_open(self) -> bool:
        """Whether a request now would be refused."""
        with self._lock:
            self._maybe_half_open()
            return self._state == self.OPEN or (self._state == self.HALF_OPEN and self._probing)

    def _maybe_half_open(self) -> None:
        if self._state == self.OPEN and self._clock() - self._opened_at >= self.cooldown_s:
            self._state = self.HALF_OPEN
            self._probing = False

    def allow(self) -> bool:
        """Whether a request may go now (in half-open state: the one probe)."""
        with self._lock:
            self._maybe_half_open()
            if self._state == self.CLOSED:
                return True
            if self._state == self.HALF_OPEN and not self._probing:
                self._probing = True
                return True
            return False

    def success(self) -> None:
        with self._lock:
            self._state = self.CLOSED
            self._failures = 0
            self._probing = False

    def release(self) -> None:
        """Nothing was learnt from the request allowed: a half-open breaker may probe again."""
        with self._lock:
            self._probing = False

    def failure(self) -> None:
        with self._lock:
            self._failures += 1
            if self._state == self.HALF_OPEN or self._failures >= self.threshold:
                if self._state != self.OPEN:
                    self.opened += 1
                self._state = self.OPEN
                self._opened_at = self._clock()
                self._probing = False
