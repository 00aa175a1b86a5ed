"""When the device tells the gateway that its update checks fail (``POST /v2/ota/check``).

A check that fails as a whole (the plan or the signed metadata cannot be
fetched or verified, the device's own state cannot be read or written) reports
nothing about any model, so the gateway would only ever see a device that never
reports. The background updater therefore keeps the streak of failed checks and
says, pure of I/O (time is passed in):

- at the first failure of a streak: failing, and why;
- while they keep failing, again at most every :data:`REPORT_EVERY_S` (the count
  of failures in a row and the latest reason), so a device checking every
  second costs the gateway one request per interval, not one per check;
- at the first success after a failure the gateway heard of: not failing any more.

A status the gateway did not take (unreachable, an error) is tried again at the
next check; one it took is not sent again until it is due.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["REPORT_EVERY_S", "CheckFailures"]

REPORT_EVERY_S = 600.0


@dataclass
class CheckFailures:
    """The streak of failed update checks, and what the gateway was told of it."""

    report_every_s: float = REPORT_EVERY_S
    failures: int = 0  # checks in a row that failed
    detail: str = ""  # why the last one failed
    told_at: float | None = None  # when the gateway took this streak's last status
    gateway_failing: bool = False  # the last status the gateway took said failing

    def failed(self, detail: str, now: float) -> dict[str, Any] | None:
        """A check failed for ``detail``: the status to send now, or ``None`` (not due)."""
        self.failures += 1
        self.detail = detail
        if self.told_at is not None and now - self.told_at < self.report_every_s:
            return None
        return {"failing": True, "failures": self.failures, "detail": detail[:400]}

    def succeeded(self) -> dict[str, Any] | None:
        """A check succeeded: the streak ends; the status to send now (the gateway was
        told of failures and not yet that they ended), or ``None``."""
        self.failures, self.detail, self.told_at = 0, "", None
        return {"failing": False} if self.gateway_failing else None

    def told(self, status: dict[str, Any], now: float) -> None:
        """The gateway took ``status`` at ``now``."""
        self.gateway_failing = bool(status.get("failing"))
        self.told_at = now if self.gateway_failing else None
