"""The device's updater: check, verify, download, install, smoke-test, switch, report.

One check (:meth:`OtaUpdater.check`), for each model the gateway's plan names:

1. refresh the signed metadata with python-tuf (signatures from the trusted
   root, versions never going back, nothing expired, snapshot consistency);
   the plan is only a hint: a target it names must be in signed metadata,
   for this device's group, and newer than what is installed;
2. fetch the group's wrapped data key (a signed target too) and unwrap it;
3. download the blob, resuming after a cut, never past its signed length;
4. check its length and SHA-256 against the signed metadata, then every
   chunk's authentication tag, streaming (memory does not grow with the model);
5. write it to the inactive slot and flush it to disk;
6. smoke-test it: decrypt in memory, load it, run its golden inputs, compare
   within tolerance, within the profile's latency budget;
7. switch the active slot atomically, tell the agent (which swaps the model
   without failing a request), report to the gateway.

Any failure leaves the active slot as it was and is reported. Verification
of metadata is python-tuf's (pure); blob checks are
:mod:`edge_agent.ota.crypto`'s (pure); this module does the I/O around them.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.errors import (
    DownloadError,
    EdgeError,
    IntegrityError,
    MetadataError,
    NoKeyError,
    SmokeTestError,
    UpdateError,
)
from edge_agent.ota.bundle import Enrollment
from edge_agent.ota.crypto import unwrap_key, verify_blob
from edge_agent.ota.fetch import GatewayFetcher, download_resumable
from edge_agent.ota.store import OtaStore, SlotInfo
from edge_agent.package import ModelPackage
from edge_agent.profiles.schema import DeviceProfile
from edge_agent.runtime import open_best

__all__ = ["OtaUpdater", "UpdateOutcome", "UpdateSettings", "smoke_test"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpdateSettings:
    """How the updater reaches the gateway and paces itself.

    Attributes:
        url: the gateway's REST base URL (``http://host:8000``).
        state_dir: where slots, partial downloads and trusted metadata live.
        interval_s, jitter_s: the periodic check (a random 0..jitter is added).
        expiry_slack_s: accept metadata this long past its expiry (devices
            without a real-time clock boot into the past or the future).
        bandwidth: bytes per second for blob downloads (``None``: no cap).
        attempts: download attempts (each resumes where the last stopped).
        timeout_s: per request.
    """

    url: str
    state_dir: Path
    interval_s: float = 3600.0
    jitter_s: float = 300.0
    expiry_slack_s: float = 0.0
    bandwidth: int | None = None
    attempts: int = 4
    timeout_s: float = 30.0


@dataclass
class UpdateOutcome:
    name: str
    version: int
    status: str  # installed, failed, rolled_back, current, skipped
    detail: str = ""
    seconds: float = 0.0
    smoke: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def smoke_test(package: ModelPackage, profile: DeviceProfile, *, runs: int = 5) -> dict[str, Any]:
    """Load ``package`` (from memory), run its golden inputs, check outputs and latency.

    Raises:
        SmokeTestError: it does not load, its outputs are off, or it is too slow.
    """
    try:
        variant, session = open_best(
            package,
            profile.runtime,
            precisions=profile.precisions,
            formats=profile.formats,
            profile_name=f"profile {profile.id}",
        )
        golden = package.golden()
        outputs = session.run(golden.inputs)
    except EdgeError as exc:
        raise SmokeTestError(f"{package.qualified_name} does not run: {exc}") from exc
    worst = 0.0
    for name, expected in golden.outputs.items():
        actual = outputs.get(name)
        if actual is None or actual.shape != expected.shape:
            raise SmokeTestError(
                f"{package.qualified_name}: output {name!r} is missing or misshapen"
            )
        if not variant.tolerance.allclose(actual, expected):
            worst = float(np.max(np.abs(actual.astype(np.float64) - expected)))
            raise SmokeTestError(
                f"{package.qualified_name} {variant.id}: output {name!r} is off the golden "
                f"output by {worst:.4g} (tolerance {variant.tolerance.atol:g})"
            )
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        session.run(golden.inputs)
        timings.append((time.perf_counter() - started) * 1000)
    latency = float(np.median(timings))
    budget = profile.latency_budget_ms
    if budget is not None and latency > budget:
        raise SmokeTestError(
            f"{package.qualified_name}: {latency:.1f} ms on its golden inputs, over the "
            f"profile's budget of {budget:g} ms"
        )
    return {"variant": variant.id, "latency_ms": round(latency, 3), "budget_ms": budget}


class OtaUpdater:
    def __init__(
        self,
        settings: UpdateSettings,
        enrollment: Enrollment,
        profile: DeviceProfile,
        *,
        store: OtaStore | None = None,
        client: Any = None,
        on_installed: Callable[[str, ModelPackage], None] = lambda name, package: None,
        on_step: Callable[[str], None] = lambda step: None,
        on_progress: Callable[[str, int, int], None] = lambda name, done, total: None,
    ) -> None:
        import httpx

        self.settings = settings
        self.enrollment = enrollment
        self.profile = profile
        self.store = store or OtaStore(settings.state_dir / "ota")
        self.client = client or httpx.Client(
            base_url=settings.url.rstrip("/"),
            headers={"authorization": f"Bearer {enrollment.token}"},
            timeout=settings.timeout_s,
        )
        self.on_installed = on_installed
        self.on_step = on_step
        self.on_progress = on_progress
        self._lock = threading.Lock()  # one check at a time
        self._last_step_mib = 0
        self._wake = threading.Event()
        self._stop = threading.Event()

    # -- the signed metadata ------------------------------------------------------------

    def _tuf(self) -> Any:
        from tuf.api import exceptions
        from tuf.ngclient import Updater, UpdaterConfig

        cached = self.store.metadata / "root.json"
        bootstrap = None if cached.is_file() else self.enrollment.trusted_root
        if bootstrap is None and not cached.is_file():
            raise MetadataError(
                "no trusted root: the enrollment bundle has none and none is cached"
            )
        base = self.settings.url.rstrip("/")
        try:
            updater = Updater(
                metadata_dir=str(self.store.metadata),
                metadata_base_url=f"{base}/v2/ota/metadata/",
                target_base_url=f"{base}/v2/ota/targets/",
                target_dir=str(self.store.downloads),
                fetcher=GatewayFetcher(self.client, timeout=self.settings.timeout_s),
                config=UpdaterConfig(),
                bootstrap=bootstrap,
            )
            if self.settings.expiry_slack_s:
                # python-tuf judges expiry against the time its trusted set was made; a
                # device without a real-time clock gets the configured slack.
                trusted = updater._trusted_set
                trusted.reference_time -= timedelta(seconds=self.settings.expiry_slack_s)
            updater.refresh()
        except exceptions.RepositoryError as exc:
            raise MetadataError(f"the update metadata failed verification: {exc}") from exc
        except exceptions.DownloadError as exc:
            raise DownloadError(f"cannot fetch the update metadata: {exc}") from exc
        return updater

    def _targetinfo(self, updater: Any, path: str) -> Any:
        from tuf.api import exceptions

        try:
            return updater.get_targetinfo(path)
        except exceptions.RepositoryError as exc:
            raise MetadataError(f"the targets metadata failed verification: {exc}") from exc

    # -- one check ------------------------------------------------------------------------

    def plan(self) -> list[dict[str, Any]]:
        import httpx

        try:
            response = self.client.get("/v2/ota/plan")
        except httpx.HTTPError as exc:
            raise DownloadError(f"cannot reach the gateway for the update plan: {exc}") from exc
        if response.status_code != 200:
            raise DownloadError(
                f"the update plan: HTTP {response.status_code}: {response.text[:200]}"
            )
        models = response.json().get("models", [])
        return [m for m in models if isinstance(m, dict)]

    def check(self) -> list[UpdateOutcome]:
        """One update check for every model the plan names.

        Raises:
            UpdateError: the plan or the metadata could not be fetched or verified
                (per-model failures are outcomes, reported to the gateway).
        """
        with self._lock:
            self.on_step("plan")
            plan = self.plan()
            if not plan:
                return []
            self.on_step("metadata")
            updater = self._tuf()
            outcomes = []
            for entry in plan:
                outcome = self._one(updater, entry)
                outcomes.append(outcome)
                if outcome.status in ("installed", "failed", "rolled_back"):
                    self.report(outcome)
            return outcomes

    def _one(self, updater: Any, entry: dict[str, Any]) -> UpdateOutcome:
        name, version = str(entry.get("name")), int(entry.get("version", 0))
        started = time.monotonic()
        active = self.store.active(name)
        if active is not None and active.version == version:
            return UpdateOutcome(name, version, "current")
        if active is not None and version < active.version:
            previous = self.store.previous(name)
            if previous is not None and previous.version == version:
                self.store.rollback(name)
                self._announce(name)
                return UpdateOutcome(
                    name, version, "rolled_back", f"the plan withdrew v{active.version}"
                )
            return UpdateOutcome(
                name,
                version,
                "skipped",
                f"v{version} is older than the installed v{active.version}",
            )
        try:
            info, smoke = self._install(updater, name, version, str(entry.get("target", "")))
        except UpdateError as exc:
            log.warning("update of %s to v%d failed: %s", name, version, exc)
            return UpdateOutcome(name, version, "failed", str(exc), time.monotonic() - started)
        return UpdateOutcome(name, info.version, "installed", "", time.monotonic() - started, smoke)

    def _install(
        self, updater: Any, name: str, version: int, target: str
    ) -> tuple[SlotInfo, dict[str, Any]]:
        group = self.enrollment.group
        info = self._targetinfo(updater, target)
        if info is None:
            raise MetadataError(f"{target!r} is not in the signed metadata")
        custom = info.custom or {}
        if custom.get("model") != name or custom.get("version") != version:
            raise MetadataError(
                f"{target!r} is signed as {custom.get('model')} v{custom.get('version')}"
            )
        if group not in custom.get("groups", []):
            raise NoKeyError(f"{name} v{version} is not published for group {group!r}")
        key_path = custom.get("keys", {}).get(group)
        key_info = self._targetinfo(updater, key_path) if key_path else None
        if key_info is None:
            raise NoKeyError(f"no data key for group {group!r} in the signed metadata")
        wrapped = self._fetch_key(updater, key_info)
        data_key = unwrap_key(
            wrapped, self.enrollment.group_key, name=name, version=version, group=group
        )
        self.on_step("key")

        part = self.store.downloads / f"{info.hashes['sha256']}.part"
        digest = self._download(info, part, name)
        self.on_step("downloaded")
        # the length is held to the signed one while downloading; the hash is checked now,
        # before anything is decrypted
        if part.stat().st_size != info.length or digest != info.hashes["sha256"]:
            part.unlink()
            raise IntegrityError(
                f"{name} v{version}: the blob does not match the signed length and hash "
                f"(sha256 {digest[:16]}..., expected {info.hashes['sha256'][:16]}...)"
            )
        self.on_step("hash-verified")
        with part.open("rb", buffering=0) as handle:
            verify_blob(
                handle,
                data_key,
                name=name,
                version=version,
                on_chunk=lambda index: self.on_step(f"tag-verified:{name}:{index}"),
            )
        self.on_step("tags-verified")

        slot = self.store.prepare(name)
        self.on_step("slot-prepared")
        written = self.store.write(
            slot,
            name=name,
            version=version,
            payload=part,
            wrapped_key=wrapped,
            sha256=info.hashes["sha256"],
            on_step=self.on_step,
        )
        self.on_step("slot-written")
        try:
            package = self.store.package(name, group, self.enrollment.group_key, written)
            smoke = smoke_test(package, self.profile)
        except SmokeTestError:
            self.store.discard(slot)
            raise
        except EdgeError as exc:
            self.store.discard(slot)
            raise SmokeTestError(f"{name} v{version} cannot be loaded: {exc}") from exc
        self.on_step("smoke-tested")
        self.store.activate(name, written.slot, on_step=self.on_step)
        self.on_step("switched")
        self.on_installed(name, package)
        return written, smoke

    def _fetch_key(self, updater: Any, key_info: Any) -> dict[str, Any]:
        from tuf.api import exceptions

        try:
            path = updater.download_target(key_info, str(self.store.downloads / "key.json"))
        except exceptions.DownloadHTTPError as exc:
            if exc.status_code in (403, 404):
                raise NoKeyError(
                    f"the gateway has no data key for group {self.enrollment.group!r}"
                ) from exc
            raise DownloadError(f"cannot fetch the data key: {exc}") from exc
        except exceptions.DownloadError as exc:
            raise DownloadError(f"cannot fetch the data key: {exc}") from exc
        except exceptions.RepositoryError as exc:
            raise IntegrityError(f"the data key file does not match its metadata: {exc}") from exc
        try:
            document: dict[str, Any] = json.loads(Path(path).read_text())
            return document
        finally:
            Path(path).unlink(missing_ok=True)

    def _download(self, info: Any, part: Path, name: str) -> str:
        directory, _, base = info.path.rpartition("/")
        url = f"/v2/ota/targets/{directory}/{info.hashes['sha256']}.{base}"
        last: DownloadError | None = None
        self._last_step_mib = 0
        for attempt in range(self.settings.attempts):
            try:
                return download_resumable(
                    self.client,
                    url,
                    part,
                    info.length,
                    timeout=self.settings.timeout_s,
                    bandwidth=self.settings.bandwidth,
                    on_chunk=lambda done: self._chunk(name, done, info.length),
                )
            except DownloadError as exc:
                if "endless data" in str(exc):
                    part.unlink(missing_ok=True)
                    raise
                last = exc
                log.info("download of %s interrupted (%s); resuming", name, exc)
                time.sleep(min(2.0, 0.1 * 2**attempt))
        raise last or DownloadError(f"cannot download {name}")

    def _chunk(self, name: str, done: int, total: int) -> None:
        self.on_progress(name, done, total)
        mebibytes = done >> 20  # one step per MiB: the same steps whatever the network does
        if mebibytes > self._last_step_mib:
            self._last_step_mib = mebibytes
            self.on_step(f"download:{name}:{mebibytes}MiB")

    def _announce(self, name: str) -> None:
        package = self.store.package(name, self.enrollment.group, self.enrollment.group_key)
        self.on_installed(name, package)

    def report(self, outcome: UpdateOutcome) -> None:
        """Tell the gateway what happened (best effort: a failure to report is logged)."""
        import httpx

        body = {
            "name": outcome.name,
            "version": outcome.version,
            "status": outcome.status,
            "detail": outcome.detail[:400],
        }
        try:
            self.client.post("/v2/ota/report", json=body)
        except httpx.HTTPError as exc:
            log.warning("cannot report the update of %s: %s", outcome.name, exc)
        self.on_step("reported")

    def rollback(self, name: str) -> SlotInfo:
        """Go back to the previous version of ``name`` and tell the agent and the gateway."""
        with self._lock:
            previous = self.store.rollback(name)
            self._announce(name)
            self.report(UpdateOutcome(name, previous.version, "rolled_back", "by the operator"))
            return previous

    # -- in the background ----------------------------------------------------------------

    def wake(self) -> None:
        """Check now (an announcement arrived) instead of at the next interval."""
        self._wake.set()

    def run(self) -> None:
        """Check on the interval (plus jitter) until :meth:`stop`; failures are logged."""
        while not self._stop.is_set():
            try:
                self.check()
            except UpdateError as exc:
                log.warning("update check failed: %s", exc)
            delay = self.settings.interval_s + random.uniform(0, self.settings.jitter_s)
            self._wake.wait(delay)
            self._wake.clear()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def close(self) -> None:
        self.client.close()
