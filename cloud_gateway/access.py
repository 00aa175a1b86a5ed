"""Who may call the gateway, and when each device was last heard from.

Every front end (REST, its direct inference path, gRPC, the MQTT bridge) asks
:class:`Access` for the calling device, within its rate limit, before it hands a
request to the data plane, which never sees a token: the data plane takes the device
as given, as it takes the request already parsed.

"Last heard" is what ``device list`` and the dashboard show: a request (and, through
the update service, an update check or a report) notes it here in memory, one entry a
device, and the gateway writes what it took in one batch a second
(:meth:`Access.take_heard`), so that no request waits on the state database. Deadlines
and rate limits run on a monotonic clock, "last heard" on the wall clock (a moment the
database keeps and an operator reads): both are injected.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cloud_gateway.auth import Device, DeviceRegistry, RateLimiter
from cloud_gateway.config import RateLimitSettings
from edge_core.errors import PermissionDenied

__all__ = ["Access"]


class Access:
    """The devices of ``registry``, each within ``rate_limit``, and when each was last
    heard from."""

    def __init__(
        self,
        registry: DeviceRegistry,
        rate_limit: RateLimitSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``clock`` keeps the rate limits; ``wall`` stamps when a device was heard from."""
        self.registry = registry
        self.limiter = RateLimiter(rate_limit.requests_per_second, rate_limit.burst, clock=clock)
        self._wall = wall
        # device -> when it was last heard from, and how; one entry a registered device
        self._heard: dict[str, tuple[float, str]] = {}

    def authenticate(
        self, token: str | None, *, admin: bool = False, scrape: bool = False
    ) -> Device:
        """The calling device, within its rate limit, noted as heard from. A metrics
        token is taken only with ``scrape`` (/metrics): a scraper's credential may do
        nothing else.

        Raises:
            Unauthenticated, PermissionDenied, RateLimited
        """
        device = self.registry.authenticate(token)
        if device.role == "metrics" and not scrape:
            raise PermissionDenied(f"{device.id!r} is a metrics token: it may read /metrics only")
        if admin and device.role != "admin":
            raise PermissionDenied(f"device {device.id!r} may not manage the repository")
        self.limiter.check(device.id)
        self._heard[device.id] = (self._wall(), "request")
        return device

    def note_heard(self, device_id: str, what: str) -> None:
        """Note that an authenticated device was heard from (``what``: an update check,
        a report); written with the rest in a batch, not by the request."""
        self._heard[device_id] = (self._wall(), what)

    def take_heard(self) -> dict[str, tuple[float, str]]:
        """The devices heard from since the last call, when and how (``device list``)."""
        heard, self._heard = self._heard, {}
        return heard
