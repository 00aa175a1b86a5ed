"""Installing one signed model version: key, download, verify, smoke-test, write, switch.

:meth:`Installer.install`, given the verified metadata of the check:

1. the target must be signed as this model and version, not withdrawn, and
   published for this device's group; its group's wrapped data key (a signed
   target too) is fetched and unwrapped;
2. if the inactive slot holds this very blob already (the device went back
   from it), it is smoke-tested and switched to, without a download;
3. otherwise the blob is downloaded, resuming after a cut and never past its
   signed length, then its length and SHA-256 are checked, then every
   chunk's tag (streaming: memory does not grow with the model);
4. it is smoke-tested from the verified download, decrypted in memory, while
   the previous version is still untouched in the inactive slot;
5. only then is the inactive slot emptied, the blob (still encrypted) moved
   into it and flushed, and the active slot switched with one ``rename``.

Each step is announced to ``on_step`` (the power-loss tests stop there).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_agent.ota.bundle import Enrollment
from edge_agent.ota.fetch import download_resumable
from edge_agent.ota.signed import SignedMetadata
from edge_agent.ota.smoke import smoke_test
from edge_agent.ota.store import OtaStore, SlotInfo, open_package
from edge_agent.profiles.schema import DeviceProfile
from edge_core.errors import (
    DownloadError,
    DownloadRefused,
    EdgeError,
    IntegrityError,
    MetadataError,
    NoKeyError,
    SmokeTestError,
    UpdateError,
)
from edge_core.ota.crypto import unwrap_key, verify_blob
from edge_core.ota.plan import payload_target
from edge_core.package import ModelPackage

__all__ = ["Installer"]

log = logging.getLogger(__name__)


class Installer:
    """Installs versions into ``store`` (the caller holds the store's lock)."""

    def __init__(
        self,
        store: OtaStore,
        client: Any,
        enrollment: Enrollment,
        profile: DeviceProfile,
        *,
        attempts: int = 4,
        timeout_s: float = 30.0,
        bandwidth: int | None = None,
        on_step: Callable[[str], None] = lambda step: None,
        on_progress: Callable[[str, int, int], None] = lambda name, done, total: None,
        on_installed: Callable[[str, ModelPackage], None] = lambda name, package: None,
    ) -> None:
        self.store = store
        self.client = client
        self.enrollment = enrollment
        self.profile = profile
        self.attempts = attempts
        self.timeout_s = timeout_s
        self.bandwidth = bandwidth
        self.on_step = on_step
        self.on_progress = on_progress
        self.on_installed = on_installed
        self._last_step_mib = 0

    def install(
        self, signed: SignedMetadata, name: str, version: int
    ) -> tuple[SlotInfo, dict[str, Any]]:
        """Install ``name`` ``version``; returns its slot and the smoke test's figures.

        Raises:
            UpdateError: any step failed (the active slot is as it was).
        """
        group = self.enrollment.group
        target = payload_target(name, version)
        info = signed.target(target)
        if info is None:
            raise MetadataError(f"{target!r} is not in the signed metadata")
        custom = info.custom or {}
        if custom.get("model") != name or custom.get("version") != version:
            raise MetadataError(
                f"{target!r} is signed as {custom.get('model')} v{custom.get('version')}"
            )
        if custom.get("withdrawn") is True:
            raise MetadataError(f"{name} v{version} is withdrawn in the signed metadata")
        if group not in custom.get("groups", []):
            raise NoKeyError(f"{name} v{version} is not published for group {group!r}")
        key_path = custom.get("keys", {}).get(group)
        key_info = signed.target(key_path) if key_path else None
        if key_info is None:
            raise NoKeyError(f"no data key for group {group!r} in the signed metadata")
        wrapped = signed.fetch_key(key_info, group)
        data_key = unwrap_key(
            wrapped, self.enrollment.group_key, name=name, version=version, group=group
        )
        self.on_step("key")

        kept = self.store.previous(name)
        if kept is not None and (kept.version, kept.sha256, kept.length) == (
            version,
            info.hashes["sha256"],
            info.length,
        ):
            # the inactive slot holds this very blob (the device went back from it):
            # test it again and switch, without downloading it again
            package, smoke = self._smoke(kept.path / "payload", data_key, name, version)
            self.store.activate(name, kept.slot, on_step=self.on_step)
            self.on_step("switched")
            self.on_installed(name, package)
            return kept, smoke

        part = self._fetch_verified(info, name, version, data_key)
        try:
            package, smoke = self._smoke(part, data_key, name, version)
        except UpdateError:
            part.unlink(missing_ok=True)  # a verified blob that fails: not worth keeping
            raise

        # only now is the previous version given up: the inactive slot is emptied
        slot = self.store.prepare(name, on_step=self.on_step)
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
        self.store.activate(name, written.slot, on_step=self.on_step)
        self.on_step("switched")
        self.on_installed(name, package)
        return written, smoke

    def _fetch_verified(self, info: Any, name: str, version: int, data_key: bytes) -> Path:
        """Download the blob (resuming), then check its length, hash and every tag.

        Raises:
            DownloadError: it cannot be downloaded, or runs past its signed length.
            IntegrityError: it does not match the signed metadata, or a tag fails.
        """
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
        return part

    def _smoke(
        self, payload: Path, data_key: bytes, name: str, version: int
    ) -> tuple[ModelPackage, dict[str, Any]]:
        """Decrypt ``payload`` into memory and smoke-test it.

        Raises:
            SmokeTestError: it does not load or does not pass.
            IntegrityError: it does not decrypt.
        """
        try:
            package = open_package(payload, data_key, name=name, version=version)
            smoke = smoke_test(package, self.profile)
        except (SmokeTestError, IntegrityError):
            raise
        except EdgeError as exc:
            raise SmokeTestError(f"{name} v{version} cannot be loaded: {exc}") from exc
        self.on_step("smoke-tested")
        return package, smoke

    def _download(self, info: Any, part: Path, name: str) -> str:
        directory, _, base = info.path.rpartition("/")
        url = f"/v2/ota/targets/{directory}/{info.hashes['sha256']}.{base}"
        last: DownloadError | None = None
        self._last_step_mib = 0
        for attempt in range(self.attempts):
            try:
                return download_resumable(
                    self.client,
                    url,
                    part,
                    info.length,
                    timeout=self.timeout_s,
                    bandwidth=self.bandwidth,
                    on_chunk=lambda done: self._chunk(name, done, info.length),
                )
            except DownloadRefused as exc:  # asking again cannot help
                if exc.discard:
                    part.unlink(missing_ok=True)
                raise
            except DownloadError as exc:
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
