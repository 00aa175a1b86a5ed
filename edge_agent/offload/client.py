"""The offload client: one transport behind retries, a deadline and a circuit breaker.

- Deadlines: each attempt gets what is left of the request's deadline; none
  starts after it.
- Retries: only when the gateway was unavailable (connection refused,
  UNAVAILABLE, 503), at most ``retries`` times, after a jittered, doubling
  pause that also fits the deadline. A timeout or a refusal is not retried.
- Circuit breaker: unavailability and timeouts count as failures (a timeout
  only when the attempt had at least ``min_budget_s``: a deadline too short for
  any gateway says nothing about the link); an open breaker refuses at once
  (:class:`BreakerOpen`), so a dead link costs nothing. Whatever a transport
  raises, the breaker hears of it: it never stays half-open on an error.
- Privacy: every request is checked by the :class:`ExitGuard` before it reaches
  the transport (without one given, a guard with the default rules and no face
  detector: it refuses any picture it cannot search); its refusals do not count
  against the link.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable

from edge_agent.offload.base import Transport
from edge_agent.offload.breaker import CircuitBreaker
from edge_agent.offload.guard import ExitGuard
from edge_agent.policy.rules import PolicyRules
from edge_agent.privacy import PrivacyInspector
from edge_core.errors import (
    BreakerOpen,
    OffloadRejected,
    OffloadTimeout,
    OffloadUnavailable,
)
from edge_core.protocol.types import InferRequest, InferResponse

__all__ = ["OffloadClient"]


class OffloadClient:
    def __init__(
        self,
        transport: Transport,
        *,
        guard: ExitGuard | None = None,
        breaker: CircuitBreaker | None = None,
        retries: int = 2,
        backoff_s: float = 0.02,
        min_budget_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.transport = transport
        self.guard = guard or ExitGuard(PrivacyInspector(None), PolicyRules())
        self.breaker = breaker or CircuitBreaker(clock=clock)
        self.retries = retries
        self.backoff_s = backoff_s
        self.min_budget_s = min_budget_s
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.attempts = 0
        self.retried = 0

    def infer(
        self,
        request: InferRequest,
        *,
        deadline: float,
        label: str | None = None,
        redacted: bool = False,
        request_id: str | None = None,
    ) -> InferResponse:
        """Send ``request``; ``deadline`` is on this client's clock.

        Raises:
            PrivacyRefusal: the exit guard refused the data.
            BreakerOpen: the breaker is open.
            OffloadTimeout: the deadline passed.
            OffloadUnavailable: the gateway stayed unreachable through the retries.
            OffloadRejected: the gateway answered with an error.
        """
        request_id = request_id or uuid.uuid4().hex
        self.guard.check(request, label=label, redacted=redacted)
        if not self.breaker.allow():
            raise BreakerOpen("the circuit breaker is open: the gateway failed repeatedly")
        attempt = 0
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                self.breaker.release()  # nothing was sent: nothing learnt about the link
                raise OffloadTimeout("the deadline passed before the request could be sent")
            self.attempts += 1
            try:
                response = self.transport.infer(request, timeout=remaining, request_id=request_id)
            except OffloadUnavailable:
                pause = self.backoff_s * (2**attempt) * self._rng.uniform(0.5, 1.5)
                if attempt >= self.retries or self._clock() + pause >= deadline:
                    self.breaker.failure()
                    raise
                attempt += 1
                self.retried += 1
                self._sleep(pause)
                continue
            except OffloadTimeout:
                if remaining >= self.min_budget_s:
                    self.breaker.failure()
                else:
                    self.breaker.release()
                raise
            except OffloadRejected:
                self.breaker.success()  # the link works; the request was wrong
                raise
            except Exception as exc:  # a transport's own bug or a closed channel
                self.breaker.failure()
                raise OffloadUnavailable(
                    f"the {self.transport.name} transport failed: {exc!r}"
                ) from exc
            self.breaker.success()
            return response

    def close(self) -> None:
        self.transport.close()
