"""The device's updater: check, verify, download, smoke-test, install, switch, report.

(Over 400 lines: the workflow of one check, each outcome beside the step that gives it.)

One check (:meth:`OtaUpdater.check`) holds the store's lock (one update at a
time, across processes) and, for each model the gateway's plan names:

1. refresh the signed metadata with python-tuf (signatures from the trusted
   root, versions never going back, nothing expired, snapshot consistency);
   the plan is only a hint (:mod:`edge_core.ota.plan`): a target it names
   must be in signed metadata, for this device's group, not withdrawn, and
   newer than what is installed; a target published for device profiles
   (``models publish --profile``) that do not include this device's is
   skipped, not downloaded (not for this device: no fault, nothing reported);
2. check that it fits (the maximum model size, the free space), fetch the
   group's wrapped data key (a signed target too) and unwrap it;
3. download the blob, resuming after a cut, never past its signed length,
   never below the minimum rate nor past its deadline (an abandoned download
   is kept and resumed at the next check; partial downloads of targets no
   longer offered are removed);
4. check its length and SHA-256 against the signed metadata, then every
   chunk's authentication tag, streaming (memory does not grow with the model);
5. smoke-test it from the verified download: decrypt in memory (within its
   signed plaintext length, its variant the signed one), load it, run its
   golden inputs, compare within tolerance, within the profile's latency
   budget (before anything on disk changes: a failed model costs nothing);
6. write it to the inactive slot and flush it to disk;
7. switch the active slot atomically, tell the agent (which swaps the model
   without failing a request), report to the gateway.

Going back is never the plan's decision alone: a device leaves its active
version only when the signed targets metadata no longer lists it or marks it
``withdrawn`` (``cloud-gateway models withdraw``), and only for a complete
previous version that is itself still signed and not withdrawn. Otherwise it
stays, and says why in the outcome and the log.

Every download (the plan, metadata, key files, blobs) is held to the same
pace (``ota.min_rate``), so no server can hold the check, and the lock, for
longer than its deadline. Any failure leaves the active slot as it was and is
reported: ``refused`` when the device did not take the version in (retried at
the next check), ``failed`` when the version itself does not work. Verification
of metadata is python-tuf's (pure, behind :mod:`edge_agent.ota.signed`);
blob checks are :mod:`edge_core.ota.crypto`'s (pure); steps 2-7 are
:mod:`edge_agent.ota.install`'s; this module decides, per model, whether to
install, stay or go back, and reports. A background check that fails as a whole
reports no model, so :meth:`OtaUpdater.run` tells the gateway that checks fail, and
why, as :mod:`edge_agent.ota.failures` says when.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edge_agent.config import OtaSettings
from edge_agent.ota.bundle import Enrollment
from edge_agent.ota.failures import CheckFailures
from edge_agent.ota.fetch import Pace, fetch_plan
from edge_agent.ota.install import Installer
from edge_agent.ota.signed import SignedMetadata, refresh
from edge_agent.ota.smoke import smoke_test
from edge_agent.ota.store import OtaStore, SlotInfo
from edge_agent.profiles.schema import DeviceProfile
from edge_core.errors import (
    ConfigError,
    DownloadError,
    IntegrityError,
    MetadataError,
    ModelNotFoundError,
    StorageError,
    UpdateError,
)
from edge_core.ota.plan import PlanEntry, parse_plan, payload_target
from edge_core.package import ModelPackage

__all__ = ["OtaUpdater", "Rollback", "UpdateOutcome", "not_for_profile", "smoke_test"]

log = logging.getLogger(__name__)

REPORTED = ("installed", "failed", "rolled_back", "refused")
# What the device did not take in: bytes that did not arrive (in time), did not match
# their signed metadata, or did not fit. Reported "refused": that blocks nothing on the
# device, which tries again at the next check (a "failed" version is not offered to it
# again), so whoever can slow or corrupt bytes in transit cannot keep a version away.
REFUSALS = (DownloadError, IntegrityError, StorageError)


@dataclass(frozen=True)
class Rollback:
    """Where a rollback went: ``version`` of ``name``, from ``source`` (an OTA slot, or
    the bundled model)."""

    name: str
    version: int
    source: str


@dataclass
class UpdateOutcome:
    """What one check did about one model.

    ``status``: installed, failed (the version was taken in and does not work
    here: not verified as published for this device, not loadable, its smoke
    test failed), refused (not taken in: its download, or its metadata, did
    not verify, arrive in time or fit; tried again at the next check),
    rolled_back (``version`` is the one left), current, or skipped (the
    device stays; ``detail`` says why).
    """

    name: str
    version: int
    status: str
    detail: str = ""
    seconds: float = 0.0
    smoke: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def not_for_profile(custom: Any, profile: str) -> str | None:
    """Why a target's signed custom fields keep it from a device of ``profile``, or ``None``.

    ``profiles`` empty or absent: for every device; otherwise it must name
    ``profile``. Anything but a list of strings there is for no device. Pure.
    """
    profiles = custom.get("profiles", []) if isinstance(custom, dict) else []
    if not isinstance(profiles, list) or not all(isinstance(p, str) for p in profiles):
        return f"is not for this device: its signed profiles are malformed ({profiles!r:.80})"
    if profiles and profile not in profiles:
        return (
            f"is not for this device: it is published for profiles {', '.join(profiles)}, "
            f"and this device's is {profile}"
        )
    return None


def _gateway_url(settings: OtaSettings, enrollment: Enrollment) -> str:
    """``settings.url``, else the enrollment bundle's gateway, without a trailing slash.

    Raises:
        ConfigError: neither names the gateway.
    """
    url = settings.url or enrollment.gateway
    if not url:
        raise ConfigError(
            "ota.url: the gateway's REST address is needed (the enrollment bundle has "
            'none): set url = "http://GATEWAY:8000" in [ota], or enroll the device with '
            "`cloud-gateway device add ID --group G --gateway http://GATEWAY:8000 "
            "--bundle FILE`"
        )
    return url.rstrip("/")


class OtaUpdater:
    def __init__(
        self,
        settings: OtaSettings,
        enrollment: Enrollment,
        profile: DeviceProfile,
        *,
        store: OtaStore | None = None,
        client: Any = None,
        on_installed: Callable[[str, ModelPackage | None], None] = lambda name, package: None,
        bundled: Callable[[str], int | None] = lambda name: None,
        on_step: Callable[[str], None] = lambda step: None,
        on_progress: Callable[[str, int, int], None] = lambda name, done, total: None,
    ) -> None:
        """``settings.url`` (else the enrollment bundle's gateway) is the gateway's.

        Raises:
            ConfigError: neither names the gateway.
        """
        import httpx

        self.url = _gateway_url(settings, enrollment)
        self.settings = settings
        self.enrollment = enrollment
        self.profile = profile
        self.store = store or OtaStore(settings.state_dir / "ota")
        self.client = client or httpx.Client(
            base_url=self.url,
            headers={"authorization": f"Bearer {enrollment.token}"},
            timeout=settings.timeout_s,
        )
        self.on_installed = on_installed
        self.bundled = bundled  # the version of a model the device has without updates
        self.on_step = on_step
        self.on_progress = on_progress
        self.listeners: list[Callable[[UpdateOutcome], None]] = []  # told of every report
        # the device's periodic telemetry by kind, sent with every check when the device
        # has no broker to send it through (the daemon sets it; None: not sent)
        self.telemetry: Callable[[], dict[str, dict[str, Any]]] | None = None
        self._lock = threading.Lock()  # one check at a time
        self.pace = Pace(settings.min_rate, settings.rate_window_s)
        self._installer = self._new_installer()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.failures = CheckFailures()  # the background checks' failures in a row

    def _new_installer(self) -> Installer:
        """The installer, held to the settings; its callbacks go through this updater's,
        so that a caller may set them after it is made."""
        settings = self.settings
        return Installer(
            self.store,
            self.client,
            self.enrollment,
            self.profile,
            attempts=settings.attempts,
            timeout_s=settings.timeout_s,
            bandwidth=settings.bandwidth or None,
            pace=self.pace,
            max_model_bytes=settings.max_model_bytes,
            min_free_bytes=settings.min_free_bytes,
            on_step=lambda step: self.on_step(step),
            on_progress=lambda name, done, total: self.on_progress(name, done, total),
            on_installed=lambda name, package: self.on_installed(name, package),
        )

    def _metadata(self) -> SignedMetadata:
        return refresh(
            url=self.url,
            client=self.client,
            metadata_dir=self.store.metadata,
            downloads=self.store.downloads,
            trusted_root=self.enrollment.trusted_root,
            timeout_s=self.settings.timeout_s,
            expiry_slack_s=self.settings.expiry_slack_s,
            pace=self.pace,
        )

    # -- one check ------------------------------------------------------------------------

    def plan(self) -> list[PlanEntry]:
        """The gateway's plan (at most :data:`~edge_core.ota.plan.MAX_PLAN_BYTES`).

        Raises:
            DownloadError: the gateway cannot be reached, its plan comes too
                slowly, or is too long or malformed.
        """
        body = fetch_plan(self.client, timeout=self.settings.timeout_s, pace=self.pace)
        return parse_plan(body)

    def check(self) -> list[UpdateOutcome]:
        """One update check for every model the plan names.

        Raises:
            UpdateError: the plan or the metadata could not be fetched or verified
                (per-model failures are outcomes, reported to the gateway).
        """
        with self._lock, self.store.locked():
            self.send_telemetry()
            self.on_step("plan")
            plan = self.plan()
            if not plan:
                return []
            self.on_step("metadata")
            try:
                signed = self._metadata()
            except MetadataError as exc:
                # tampered, replayed, expired, or signed by a key the root does not
                # trust: the operator hears of it, and a rollout whose devices keep
                # refusing its metadata pauses itself
                for entry in plan:
                    active = self.store.active(entry.name)
                    # only what the device would have installed: a version it runs stays
                    # reported as installed
                    if not entry.withdrawn and (active is None or entry.version > active.version):
                        self.report(
                            UpdateOutcome(
                                entry.name,
                                entry.version,
                                "refused",
                                f"the signed metadata was refused: {exc}",
                            )
                        )
                raise
            self._clean_downloads(signed, plan)
            outcomes = []
            for entry in plan:
                outcome = self._guarded(signed, entry)
                if outcome is None:
                    continue
                outcomes.append(outcome)
                if outcome.status in REPORTED:
                    self.report(outcome)
            if any(outcome.status in REPORTED for outcome in outcomes):
                self.send_telemetry()  # what it serves now
            return outcomes

    def _clean_downloads(self, signed: SignedMetadata, plan: list[PlanEntry]) -> None:
        keep = set()
        for entry in plan:
            try:
                info = signed.target(payload_target(entry.name, entry.version))
            except MetadataError:
                return  # not sure what is still offered: keep everything this time
            if info is not None and not entry.withdrawn:
                keep.add(info.hashes["sha256"])
        removed = self.store.clean_downloads(keep)
        if removed:
            log.info("removed partial downloads no longer offered: %s", ", ".join(removed))

    def _guarded(self, signed: SignedMetadata, entry: PlanEntry) -> UpdateOutcome | None:
        """:meth:`_one`, with any unexpected error turned into a failed outcome."""
        try:
            return self._one(signed, entry)
        except Exception as exc:
            log.exception("update of %s to v%d failed unexpectedly", entry.name, entry.version)
            return UpdateOutcome(entry.name, entry.version, "failed", f"unexpected error: {exc!r}")

    def _one(self, signed: SignedMetadata, entry: PlanEntry) -> UpdateOutcome | None:
        name, version = entry.name, entry.version
        active = self.store.active(name)
        if entry.withdrawn and (active is None or active.version != version):
            return None  # an aborted version this device does not run: nothing to do
        if active is None or version > active.version:
            info = signed.target(payload_target(name, version))
            elsewhere = not_for_profile(info.custom if info else None, self.profile.id)
            if elsewhere is not None:
                return self._stay(name, version, f"v{version} {elsewhere}")
            return self._install_outcome(signed, name, version)
        # the plan names the installed version, or an older one: only a signed
        # withdrawal of the installed version moves the device
        reason = signed.withdrawal(name, active.version)
        if reason is not None:
            return self._go_back(signed, name, active, reason)
        if version == active.version and not entry.withdrawn:
            return UpdateOutcome(name, version, "current")
        why = (
            f"the gateway aborted the rollout of v{version}"
            if entry.withdrawn
            else f"the plan names v{version}, older than the installed v{active.version}"
        )
        return self._stay(
            name,
            version,
            f"{why}, but the signed metadata does not withdraw v{active.version}: staying on "
            "it until it is withdrawn there (cloud-gateway models withdraw)",
        )

    def _stay(self, name: str, version: int, detail: str) -> UpdateOutcome:
        log.warning("%s: %s", name, detail)
        return UpdateOutcome(name, version, "skipped", detail)

    def _go_back(
        self, signed: SignedMetadata, name: str, active: SlotInfo, reason: str
    ) -> UpdateOutcome:
        """Leave ``active`` for the previous version, if that one is complete and still signed."""
        previous = self.store.previous(name)
        if previous is None:
            return self._stay(
                name,
                active.version,
                f"{reason}, but there is no complete previous version to go back to: "
                f"staying on v{active.version}",
            )
        gone = signed.withdrawal(name, previous.version)
        if gone is not None:
            return self._stay(
                name,
                active.version,
                f"{reason}, and the previous version cannot be used either ({gone}): "
                f"staying on v{active.version}",
            )
        package = self.store.package(
            name, self.enrollment.group, self.enrollment.group_key, previous
        )
        self.store.activate(name, previous.slot, on_step=self.on_step)
        self.on_installed(name, package)
        detail = f"{reason}: back to v{previous.version}"
        log.warning("%s: %s", name, detail)
        return UpdateOutcome(name, active.version, "rolled_back", detail)

    def _install_outcome(self, signed: SignedMetadata, name: str, version: int) -> UpdateOutcome:
        started = time.monotonic()
        try:
            info, smoke = self._installer.install(signed, name, version)
        except UpdateError as exc:
            status = "refused" if isinstance(exc, REFUSALS) else "failed"
            log.warning("update of %s to v%d %s: %s", name, version, status, exc)
            return UpdateOutcome(name, version, status, str(exc), time.monotonic() - started)
        return UpdateOutcome(name, info.version, "installed", "", time.monotonic() - started, smoke)

    def report(self, outcome: UpdateOutcome) -> None:
        """Tell the gateway what happened (best effort: a failure to report is logged)."""
        import httpx

        detail = outcome.detail
        if outcome.status == "installed" and outcome.smoke and not detail:
            smoke = outcome.smoke
            budget = smoke.get("budget_ms")
            detail = (
                f"smoke test passed: {smoke.get('variant')} answered its golden inputs "
                f"within tolerance in {smoke.get('latency_ms')} ms"
                + (f" (budget {budget:g} ms)" if budget is not None else "")
            )
        body: dict[str, Any] = {
            "name": outcome.name,
            "version": outcome.version,
            "status": outcome.status,
            "detail": detail[:400],
        }
        serving = self.serving(outcome.name)
        if serving is not None:
            body["serving"] = serving  # what the operator's `device list` shows
        smoke = outcome.smoke
        if outcome.status == "installed" and isinstance(smoke.get("latency_ms"), (int, float)):
            # what the gateway's dashboard shows as the version's measured latency
            body["smoke"] = {
                "variant": str(smoke.get("variant") or ""),
                "latency_ms": float(smoke["latency_ms"]),
            }
        try:
            answer = self.client.post("/v2/ota/report", json=body)
            if answer.status_code >= 400:
                log.warning(
                    "the gateway refused the report of %s v%d: %d %s",
                    outcome.name, outcome.version, answer.status_code, answer.text[:300],
                )  # fmt: skip
        except httpx.HTTPError as exc:
            log.warning("cannot report the update of %s: %s", outcome.name, exc)
        self.on_step("reported")
        for listener in self.listeners:
            listener(outcome)

    def send_telemetry(self) -> None:
        """``POST /v2/telemetry`` the device's periodic telemetry (``telemetry()``), when
        it has no broker: the gateway's dashboard then hears from it at every check.
        Best effort: a failure (a gateway from before it: 404) is logged, never raised."""
        import httpx

        if self.telemetry is None:
            return
        try:
            body = {
                kind: {"time": time.time(), **document}
                for kind, document in self.telemetry().items()
                if kind in ("status", "decisions", "latency")
            }
            answer = self.client.post("/v2/telemetry", json=body, timeout=self.settings.timeout_s)
            if answer.status_code >= 400:
                log.debug("the gateway took no telemetry: %d %s", answer.status_code, answer.text)
        except httpx.HTTPError as exc:
            log.debug("cannot send telemetry to the gateway: %s", exc)
        except Exception:  # the device's own report must never stop an update check
            log.exception("the telemetry sent with the update check")

    def serving(self, name: str) -> int | None:
        """The version of ``name`` the device serves: the active slot's, else the bundled."""
        active = self.store.active(name)
        return active.version if active is not None else self.bundled(name)

    def rollback(self, name: str) -> Rollback:
        """Go back to the previous version of ``name`` and tell the agent and the gateway.

        The previous version is the other slot's, or, after the first update, the
        bundled model the device served before it (``bundled``). The operator's
        decision on the device itself: no signed withdrawal is needed. The gateway
        records the version left as ``rolled_back`` and does not offer it to this
        device again (until its rollout is started again, or a newer version comes).

        Raises:
            ModelNotFoundError: there is no complete previous version, nor a bundled one.
        """
        with self._lock, self.store.locked():
            active = self.store.active(name)
            previous = self.store.previous(name)
            bundled = self.bundled(name)
            if active is None or (previous is None and bundled is None):
                raise ModelNotFoundError(f"{name!r} has no previous version to roll back to")
            if previous is not None:
                package: ModelPackage | None = self.store.package(
                    name, self.enrollment.group, self.enrollment.group_key, previous
                )
                self.store.activate(name, previous.slot)
                back = Rollback(name, previous.version, f"slot {previous.slot}")
            else:
                assert bundled is not None
                self.store.deactivate(name)
                package = None  # the agent loads what it serves without an update
                back = Rollback(name, bundled, "the bundled model")
            self.on_installed(name, package)
            self.report(
                UpdateOutcome(
                    name,
                    active.version,
                    "rolled_back",
                    f"by the operator: back to v{back.version} ({back.source})",
                )
            )
            return back

    # -- in the background ----------------------------------------------------------------

    def wake(self) -> None:
        """Check now (an announcement arrived) instead of at the next interval."""
        self._wake.set()

    def run(self) -> None:
        """Check on the interval (plus jitter) until :meth:`stop`; failures are logged
        and told to the gateway (:mod:`edge_agent.ota.failures`).

        Never raises (short of ``BaseException``): a failed check is logged
        and the next one comes at the next interval.
        """
        while not self._stop.is_set():
            try:
                self.check()
            except UpdateError as exc:
                log.warning("update check failed: %s", exc)
                self._tell(self.failures.failed(str(exc), time.monotonic()))
            except Exception as exc:  # the thread must outlive any bug: the next may succeed
                log.exception("update check failed unexpectedly")
                self._tell(self.failures.failed(self._unexpected(exc), time.monotonic()))
            else:
                self._tell(self.failures.succeeded())
            delay = self.settings.interval_s + random.uniform(0, self.settings.jitter_s)
            self._wake.wait(delay)
            self._wake.clear()

    def _unexpected(self, exc: Exception) -> str:
        """Why a check failed unexpectedly, as the gateway shows it; a file this account
        may not use says how to give the state back to it."""
        detail = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, PermissionError):
            import pwd

            uid = os.geteuid()
            try:
                account = pwd.getpwuid(uid).pw_name
            except KeyError:
                account = str(uid)
            detail += (
                f" (the agent runs as {account}, which may not use it: a command run as "
                f"another user left it? give the state back: chown -R {account}: "
                f"{self.store.root.parent})"
            )
        return detail

    def _tell(self, status: dict[str, Any] | None) -> None:
        """``POST /v2/ota/check`` ``status`` (best effort: one the gateway does not take
        is sent again when the next check is due)."""
        import httpx

        if status is None:
            return
        try:
            answer = self.client.post("/v2/ota/check", json=status)
        except httpx.HTTPError as exc:
            log.debug("cannot tell the gateway how update checks go: %s", exc)
            return
        if answer.status_code >= 400:
            log.debug("the gateway took no check status: %d %s", answer.status_code, answer.text)
            return
        self.failures.told(status, time.monotonic())

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def close(self) -> None:
        self.client.close()
