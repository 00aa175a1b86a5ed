"""Several gateway replicas behind one transport: round robin, failover within the deadline.

Each request starts at the next replica in turn (round robin spreads a device's
requests over the replicas it was given). When that replica cannot be reached
(:class:`OffloadUnavailable`: refused, reset, 502/503, gRPC UNAVAILABLE), the
same request goes at once to the next one, with what is left of its deadline,
until each replica has been tried once; a replica that answered (even with an
error) or ran out the deadline ends the request as it would alone. So a replica
killed mid-request costs its requests one more round trip, not a failure, and
the :class:`~edge_agent.offload.client.OffloadClient`'s retries, backoff and
circuit breaker see the fleet of replicas as one gateway.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from edge_agent.offload.base import Transport
from edge_core.errors import OffloadTimeout, OffloadUnavailable
from edge_core.protocol.types import InferRequest, InferResponse

__all__ = ["FailoverTransport"]

T = TypeVar("T")


class FailoverTransport(Transport):
    def __init__(
        self, transports: Sequence[Transport], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not transports:
            raise ValueError("a failover transport needs at least one transport")
        self.transports = list(transports)
        self.name = self.transports[0].name
        self._clock = clock
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self.failovers = 0

    def infer(
        self, request: InferRequest, *, timeout: float, request_id: str = ""
    ) -> InferResponse:
        deadline = self._clock() + timeout
        with self._lock:
            first = next(self._turn) % len(self.transports)
        errors: list[str] = []
        for step in range(len(self.transports)):
            transport = self.transports[(first + step) % len(self.transports)]
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise OffloadTimeout("the deadline passed while failing over: " + "; ".join(errors))
            try:
                return transport.infer(request, timeout=remaining, request_id=request_id)
            except OffloadUnavailable as exc:
                errors.append(str(exc))
                if step + 1 < len(self.transports):
                    self.failovers += 1
        raise OffloadUnavailable("no gateway replica could be reached: " + "; ".join(errors))

    def model_metadata(self, name: str, *, timeout: float) -> dict[str, Any] | None:
        return self._ask(lambda t, left: t.model_metadata(name, timeout=left), timeout)

    def server_metadata(self, *, timeout: float) -> dict[str, Any] | None:
        return self._ask(lambda t, left: t.server_metadata(timeout=left), timeout)

    def repository_index(self, *, timeout: float) -> list[dict[str, Any]] | None:
        return self._ask(lambda t, left: t.repository_index(timeout=left), timeout)

    def _ask(self, question: Callable[[Transport, float], T], timeout: float) -> T:
        """The first replica's answer that can be reached within ``timeout``."""
        deadline = self._clock() + timeout
        error: OffloadUnavailable | None = None
        for transport in self.transports:
            left = deadline - self._clock()
            if left <= 0:
                break
            try:
                return question(transport, left)
            except OffloadUnavailable as exc:
                error = exc
        raise error or OffloadTimeout("no time left to ask a gateway replica")

    def close(self) -> None:
        for transport in self.transports:
            transport.close()
