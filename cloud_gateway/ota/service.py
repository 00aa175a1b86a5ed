"""The gateway's update service: serves the OTA repository and the rollout plan.

Devices (authenticated like every request) fetch the signed metadata and the
encrypted blobs over HTTP, with ``Range`` requests for resuming; each device
is served only its own group's key files. ``/v2/ota/plan`` tells a device
which version of each model its rollouts give it (and which aborted versions
it should leave, once the signed metadata withdraws them); ``/v2/ota/report``
records what it installed or why it failed, after checking every field (a
malformed report is a 400, never a 500); ``/v2/ota/check`` records that its
update checks fail, and why, or succeed again (:mod:`cloud_gateway.ota.checks`).

What a device sends here is kept, so it is bounded:

- a report must be about a version the device's group was offered: one the
  OTA repository publishes for the group (:class:`~.published.PublishedIndex`),
  or one a rollout of the group offers through the plan (the device's failure to
  find it in the signed metadata is what pauses such a rollout); any other
  version is a 404, counted (``on_refused("not_offered")``), not stored, so a
  device cannot invent models for the dashboard;
- both are held to :data:`REPORTS_PER_S` per device, in bursts of
  :data:`REPORT_BURST` (a device reports once per model and check): more is a
  429, counted (``"rate_limited"``);
- what is kept is one row per device and offered version, the newest
  :data:`~.rollouts.KEPT_VERSIONS` of each model
  (:meth:`~.rollouts.RolloutStore.prune_reports`), and one row per device whose
  checks fail.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloud_gateway.auth import Device, RateLimiter
from cloud_gateway.ota.checks import CheckStore
from cloud_gateway.ota.published import PublishedIndex
from cloud_gateway.ota.rollouts import Rollout, RolloutStore
from edge_core.errors import BadRequest, NotFound, RateLimited
from edge_core.names import MAX_VERSION, MODEL_NAME_RULE, is_model_name
from edge_core.ota.plan import (
    key_target,
    payload_target,
)

__all__ = ["OtaService"]

_METADATA = re.compile(r"(?:[0-9]{1,10}\.)?(?:root|targets|snapshot|timestamp)\.json")
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")
REPORT_STATUSES = ("installed", "failed", "rolled_back", "refused")
REPORTS_PER_S = 1.0  # reports and check statuses a device may send, sustained
REPORT_BURST = 30  # and at once (one per model of a check)
MAX_FAILURES = 10**9  # the count of failed checks in a row a device may say


class OtaService:
    def __init__(
        self,
        repository: Path,
        rollouts: RolloutStore,
        *,
        heard: Callable[[str, str], None] | None = None,
        on_refused: Callable[[str], None] = lambda reason: None,
        limiter: RateLimiter | None = None,
    ) -> None:
        """``heard(device, what)``: notes that a device checked or reported, for a batched
        write (the gateway's); without it, each is written at once. ``on_refused(reason)``
        counts a report refused (``not_offered``, ``rate_limited``)."""
        self.repository = Path(repository)
        self.rollouts = rollouts
        self.checks = CheckStore(rollouts.database)
        self.published = PublishedIndex(self.repository)
        self.limiter = limiter or RateLimiter(REPORTS_PER_S, REPORT_BURST, what="update reports")
        self._heard = heard or rollouts.seen
        self._on_refused = on_refused
        self.listeners: list[Callable[[Rollout], None]] = []  # told when a rollout changes

    def metadata_path(self, filename: str) -> Path:
        """The metadata file a device asks for.

        Raises:
            NotFound: not a metadata file name, or not there.
        """
        path = self.repository / "metadata" / filename
        if not _METADATA.fullmatch(filename) or not path.is_file():
            raise NotFound(f"no metadata {filename!r}")
        return path

    def target_path(self, target: str, device: Device) -> Path:
        """The target file a device asks for; key files only for its own group.

        Raises:
            NotFound: a malformed path, another group's keys, or nothing there.
        """
        parts = target.split("/")
        if not all(_SEGMENT.fullmatch(part) for part in parts):
            raise NotFound(f"no target {target!r}")
        if parts[0] == "keys" and (len(parts) < 2 or parts[1] != device.group):
            raise NotFound(f"no target {target!r} for group {device.group!r}")
        path = self.repository / "targets" / Path(*parts)
        if not path.is_file():
            raise NotFound(f"no target {target!r}")
        return path

    def plan(self, device: Device) -> dict[str, Any]:
        """The device's plan: a version per model, and aborted versions marked withdrawn."""

        def entry(name: str, version: int, **extra: Any) -> dict[str, Any]:
            return {
                "name": name,
                "version": version,
                "target": payload_target(name, version),
                "keys": key_target(device.group, name, version),
                **extra,
            }

        self._heard(device.id, "update check")
        versions, aborted = self.rollouts.assignment(device.id, device.group)
        return {
            "device": device.id,
            "group": device.group,
            "models": [entry(name, version) for name, version in sorted(versions.items())]
            + [entry(name, version, withdrawn=True) for name, version in aborted],
        }

    def _allow(self, device: Device) -> None:
        """Raises: RateLimited (counted)."""
        try:
            self.limiter.check(device.id)
        except RateLimited:
            self._on_refused("rate_limited")
            raise

    def _offered(self, device: Device, name: str, version: int) -> None:
        """Raises: NotFound (counted): ``name`` ``version`` was never offered to the
        device's group (see the module docstring)."""
        group = device.group
        if self.published.offered(group, name, version):
            return
        if self.rollouts.get(name, version, group) is not None:
            return
        self._on_refused("not_offered")
        raise NotFound(
            f"report: {name} v{version} is not published for group {group!r} nor rolled out "
            "to it; a device reports only on versions its group was offered"
        )

    def report(self, device: Device, body: Any) -> dict[str, Any]:
        """Record a device's report.

        Raises:
            RateLimited: the device sent too many reports (see the module docstring).
            BadRequest: the report is malformed.
            NotFound: it names a version the device's group was not offered.
        """
        self._allow(device)
        if not isinstance(body, dict):
            raise BadRequest("a report is a JSON object")
        name, version, status = body.get("name"), body.get("version"), body.get("status")
        if not is_model_name(name):
            raise BadRequest(f"report: 'name' must be a model name ({MODEL_NAME_RULE})")
        if (
            isinstance(version, bool)
            or not isinstance(version, int)
            or not 1 <= version <= MAX_VERSION
        ):
            raise BadRequest(f"report: 'version' must be an integer from 1 to {MAX_VERSION}")
        if status not in REPORT_STATUSES:
            raise BadRequest(f"report: 'status' must be one of {', '.join(REPORT_STATUSES)}")
        detail = _text(body, "detail")
        serving = body.get("serving")
        if serving is not None and (
            isinstance(serving, bool)
            or not isinstance(serving, int)
            or not 1 <= serving <= MAX_VERSION
        ):
            raise BadRequest(f"report: 'serving' must be an integer from 1 to {MAX_VERSION}")
        variant, latency = _smoke(body.get("smoke"))
        self._offered(device, name, version)
        self._heard(device.id, "update report")
        paused = self.rollouts.report(
            device.id, device.group, name, version, status, detail, serving=serving,
            variant=variant, latency_ms=latency,
        )  # fmt: skip
        if paused is not None:
            for listener in self.listeners:
                listener(paused)
        rollout = self.rollouts.get(name, version, device.group)
        return {"recorded": True, "rollout": rollout.to_dict() if rollout else None}

    def check_status(self, device: Device, body: Any) -> dict[str, Any]:
        """Record whether the device's update checks fail (``{"failing": true,
        "failures": N, "detail": "why"}``) or succeed again (``{"failing": false}``).

        Raises:
            RateLimited: the device sent too many reports (shared with :meth:`report`).
            BadRequest: the body is malformed.
        """
        self._allow(device)
        if not isinstance(body, dict):
            raise BadRequest("a check status is a JSON object")
        failing = body.get("failing")
        if not isinstance(failing, bool):
            raise BadRequest("check: 'failing' must be true or false")
        if not failing:
            self.checks.succeeded(device.id)
            return {"recorded": True, "failing": False}
        failures = body.get("failures")
        if (
            isinstance(failures, bool)
            or not isinstance(failures, int)
            or not 1 <= failures <= MAX_FAILURES
        ):
            raise BadRequest(f"check: 'failures' must be an integer from 1 to {MAX_FAILURES}")
        self.checks.failing(device.id, device.group, failures, _text(body, "detail", "check"))
        return {"recorded": True, "failing": True}


def _text(body: dict[str, Any], key: str, where: str = "report") -> str:
    """``body[key]``, a string of UTF-8 text (empty when absent).

    Raises:
        BadRequest: not a string, or not encodable (a lone surrogate).
    """
    text = body.get(key, "")
    if not isinstance(text, str):
        raise BadRequest(f"{where}: {key!r} must be a string")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"{where}: {key!r} holds a lone surrogate (not UTF-8 text)") from None
    return text


def _smoke(smoke: Any) -> tuple[str, float | None]:
    """A report's optional ``smoke``: the variant its smoke test ran and the latency it
    measured (ms), for the dashboard's Models page.

    Raises:
        BadRequest: not an object of a variant id and a latency from 0 to 10^6 ms.
    """
    if smoke is None:
        return "", None
    if not isinstance(smoke, dict):
        raise BadRequest("report: 'smoke' must be an object")
    variant, latency = smoke.get("variant", ""), smoke.get("latency_ms")
    if not isinstance(variant, str) or not _SEGMENT.fullmatch(variant or "x"):
        raise BadRequest("report: 'smoke.variant' must be a variant id")
    if latency is not None and (
        isinstance(latency, bool)
        or not isinstance(latency, (int, float))
        or not 0 <= latency <= 1e6
    ):
        raise BadRequest("report: 'smoke.latency_ms' must be a number from 0 to 1000000")
    return variant[:64], None if latency is None else float(latency)
