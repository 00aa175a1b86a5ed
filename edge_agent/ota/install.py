"""Installing one signed model version: key, download, verify, smoke-test, write, switch.

:meth:`Installer.install`, given the verified metadata of the check:

1. the target must be signed as this model and version, not withdrawn, and
   published for this device's group, and fit the device (:func:`lacks_room`:
   its signed lengths within the maximum model size and the file-size limit,
   the rest of it within the free space); its group's wrapped data key (a
   signed target too) is fetched and unwrapped;
2. if the inactive slot holds this very blob already (the device went back
   from it), it is smoke-tested and switched to, without a download;
3. otherwise the blob is downloaded, resuming after a cut, never past its
   signed length and never slower than the pace (all attempts together by one
   deadline), then its length and SHA-256 are checked, then every chunk's tag
   (streaming: memory does not grow with the model); a blob that fails either
   is removed;
4. it is decrypted in memory, within its signed plaintext length, its
   variant compared with the signed one, and smoke-tested, while the
   previous version is still untouched in the inactive slot;
5. only then is the inactive slot emptied, the blob (still encrypted) moved
   into it and flushed, and the active slot switched with one ``rename``.

Each step is announced to ``on_step`` (the power-loss tests stop there).
"""

from __future__ import annotations

import logging
import resource
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_agent.config import OtaSettings
from edge_agent.ota.bundle import Enrollment
from edge_agent.ota.fetch import UNPACED, Pace, download_resumable
from edge_agent.ota.signed import SignedMetadata
from edge_agent.ota.smoke import smoke_test
from edge_agent.ota.store import OtaStore, SlotInfo, open_package
from edge_agent.profiles.schema import DeviceProfile
from edge_core.errors import (
    CorruptDownload,
    DownloadError,
    DownloadRefused,
    DownloadStalled,
    EdgeError,
    IntegrityError,
    MetadataError,
    NoKeyError,
    SmokeTestError,
    StorageError,
    UpdateError,
)
from edge_core.ota.crypto import unwrap_key, verify_blob
from edge_core.ota.plan import payload_target
from edge_core.package import ModelPackage

__all__ = ["Installer", "lacks_room"]

log = logging.getLogger(__name__)


def lacks_room(
    *,
    length: int,
    plaintext_length: int,
    have: int,
    free: int,
    file_limit: int | None,
    max_bytes: int,
    min_free: int,
) -> str | None:
    """Why a blob of signed ``length`` (``plaintext_length`` once decrypted, in memory)
    cannot be taken, ``have`` bytes of it on disk already, or ``None``. Pure.

    ``free``: the free bytes of the download folder's filesystem, of which
    ``min_free`` must stay free; ``file_limit``: the process's file-size limit
    (``None``: none); ``max_bytes``: the largest model the device takes.
    """
    if max(length, plaintext_length) > max_bytes:
        return (
            f"its signed size ({length} bytes, {plaintext_length} decrypted) is over this "
            f"device's maximum model size of {max_bytes} bytes (ota.max_model_bytes)"
        )
    if file_limit is not None and length > file_limit:
        return (
            f"its signed length of {length} bytes is over this process's file-size limit "
            f"of {file_limit} bytes (ulimit -f, systemd's LimitFSIZE=)"
        )
    needed = length - have
    if needed + min_free > free:
        return (
            f"it needs {needed} more bytes on a filesystem with {free} free, of which "
            f"{min_free} must stay free (ota.min_free_bytes): free some space"
        )
    return None


def _file_limit() -> int | None:
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def _signed_plaintext_length(custom: dict[str, Any], target: str) -> int:
    value = custom.get("plaintext_length")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MetadataError(f"{target!r} is signed with no valid plaintext_length ({value!r:.40})")
    return value


def _signed_target(
    signed: SignedMetadata, name: str, version: int, group: str
) -> tuple[Any, dict[str, Any]]:
    """The signed target of ``name`` ``version`` and its custom fields: signed as that
    model and version, not withdrawn, and published for ``group``.

    Raises:
        MetadataError: it is not signed, signed as another, or withdrawn.
        NoKeyError: it is not published for ``group``.
    """
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
    return info, custom


def _check_variant(package: ModelPackage, signed: Any) -> None:
    """The package must hold the one variant its signed metadata names.

    Raises:
        IntegrityError: it holds another, or more than one.
    """
    held = [{"id": v.id, "format": v.format, "precision": v.precision} for v in package.variants]
    if held != [signed]:
        names = ", ".join(v.id for v in package.variants)
        said = signed.get("id") if isinstance(signed, dict) else signed
        raise IntegrityError(
            f"{package.qualified_name}: the package's variant is {names}, but its signed "
            f"metadata says {said!r:.80}; refused"
        )


class Installer:
    """Installs versions into ``store`` (the caller holds the store's lock).

    Every download is held to ``pace``; a target larger than ``max_model_bytes``,
    or one that would leave less than ``min_free_bytes`` free, is not fetched.
    """

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
        pace: Pace = UNPACED,
        max_model_bytes: int = OtaSettings.max_model_bytes,
        min_free_bytes: int = OtaSettings.min_free_bytes,
        on_step: Callable[[str], None] = lambda step: None,
        on_progress: Callable[[str, int, int], None] = lambda name, done, total: None,
        on_installed: Callable[[str, ModelPackage], None] = lambda name, package: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.client = client
        self.enrollment = enrollment
        self.profile = profile
        self.attempts = attempts
        self.timeout_s = timeout_s
        self.bandwidth = bandwidth
        self.pace = pace
        self.max_model_bytes = max_model_bytes
        self.min_free_bytes = min_free_bytes
        self.clock = clock
        self.on_step = on_step
        self.on_progress = on_progress
        self.on_installed = on_installed
        self._last_step_mib = 0

    def install(
        self, signed: SignedMetadata, name: str, version: int
    ) -> tuple[SlotInfo, dict[str, Any]]:
        """Install ``name`` ``version``; returns its slot and the smoke test's figures.

        Raises:
            StorageError: the device cannot hold it (nothing is fetched).
            DownloadError: the blob or its key could not be downloaded, or not at
                the pace (what arrived is kept for the next check).
            IntegrityError: the blob or its key file does not match its signed
                metadata (hash, tags, plaintext length, variant): it is removed.
            UpdateError: any other step failed (the active slot is as it was).
        """
        group = self.enrollment.group
        info, custom = _signed_target(signed, name, version, group)
        plaintext_length = _signed_plaintext_length(custom, payload_target(name, version))
        signed_as = (plaintext_length, custom.get("variant"))
        part = self.store.downloads / f"{info.hashes['sha256']}.part"
        kept = self._kept(name, version, info)
        if kept is None:  # to be downloaded: before anything is fetched, it must fit
            self._check_room(info.length, plaintext_length, part, name, version)
        wrapped, data_key = self._data_key(signed, custom, name, version)
        self.on_step("key")

        if kept is not None:
            # the inactive slot holds this very blob (the device went back from it):
            # test it again and switch, without downloading it again
            package, smoke = self._smoke(kept.path / "payload", data_key, signed_as, name, version)
            self._switch(name, kept.slot, package)
            return kept, smoke

        self._fetch_verified(info, part, name, version, data_key)
        try:
            package, smoke = self._smoke(part, data_key, signed_as, name, version)
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
        self._switch(name, written.slot, package)
        return written, smoke

    def _kept(self, name: str, version: int, info: Any) -> SlotInfo | None:
        """The inactive slot, if it holds this very blob (same version, hash and length)."""
        kept = self.store.previous(name)
        if kept is None or (kept.version, kept.sha256, kept.length) != (
            version,
            info.hashes["sha256"],
            info.length,
        ):
            return None
        return kept

    def _data_key(
        self, signed: SignedMetadata, custom: dict[str, Any], name: str, version: int
    ) -> tuple[dict[str, Any], bytes]:
        """The group's data key, wrapped (as the slot keeps it) and unwrapped.

        Raises:
            NoKeyError: the signed metadata has no key for this device's group.
            IntegrityError, DownloadError: the key file does not verify or arrive.
        """
        group = self.enrollment.group
        key_path = custom.get("keys", {}).get(group)
        key_info = signed.target(key_path) if key_path else None
        if key_info is None:
            raise NoKeyError(f"no data key for group {group!r} in the signed metadata")
        wrapped = signed.fetch_key(key_info, group)
        data_key = unwrap_key(
            wrapped, self.enrollment.group_key, name=name, version=version, group=group
        )
        return wrapped, data_key

    def _switch(self, name: str, slot: str, package: ModelPackage) -> None:
        """Make ``slot`` the active one (one ``rename``) and tell the agent."""
        self.store.activate(name, slot, on_step=self.on_step)
        self.on_step("switched")
        self.on_installed(name, package)

    def _check_room(
        self, length: int, plaintext_length: int, part: Path, name: str, version: int
    ) -> None:
        """Raises StorageError if the device cannot hold the blob (see :func:`lacks_room`)."""
        why = lacks_room(
            length=length,
            plaintext_length=plaintext_length,
            have=part.stat().st_size if part.exists() else 0,
            free=shutil.disk_usage(part.parent).free,
            file_limit=_file_limit(),
            max_bytes=self.max_model_bytes,
            min_free=self.min_free_bytes,
        )
        if why is not None:
            raise StorageError(f"{name} v{version}: {why}; not downloaded")

    def _fetch_verified(
        self, info: Any, part: Path, name: str, version: int, data_key: bytes
    ) -> None:
        """Download the blob into ``part`` (resuming), then check its length, hash and
        every tag; a blob that fails them is removed.

        Raises:
            DownloadError: it cannot be downloaded, or runs past its signed length.
            CorruptDownload: it does not match the signed length and hash.
            IntegrityError: a tag fails.
            StorageError: it cannot be written.
        """
        digest = self._download(info, part, name)
        self.on_step("downloaded")
        # the length is held to the signed one while downloading; the hash is checked now,
        # before anything is decrypted
        if part.stat().st_size != info.length or digest != info.hashes["sha256"]:
            part.unlink()
            raise CorruptDownload(
                f"{name} v{version}: the blob does not match the signed length and hash "
                f"(sha256 {digest[:16]}..., expected {info.hashes['sha256'][:16]}...); "
                "removed, the next check downloads it again"
            )
        self.on_step("hash-verified")
        try:
            with part.open("rb", buffering=0) as handle:
                verify_blob(
                    handle,
                    data_key,
                    name=name,
                    version=version,
                    on_chunk=lambda index: self.on_step(f"tag-verified:{name}:{index}"),
                )
        except IntegrityError:
            part.unlink(missing_ok=True)  # the signed bytes themselves fail: worthless
            raise
        self.on_step("tags-verified")

    def _smoke(
        self,
        payload: Path,
        data_key: bytes,
        signed_as: tuple[int, Any],
        name: str,
        version: int,
    ) -> tuple[ModelPackage, dict[str, Any]]:
        """Decrypt ``payload`` into memory, check it against what its metadata signs of it
        (``signed_as``: the plaintext length and the variant) and smoke-test it.

        Raises:
            SmokeTestError: it does not load or does not pass.
            IntegrityError: it does not decrypt, or is not what its metadata says.
        """
        try:
            package = open_package(
                payload,
                data_key,
                name=name,
                version=version,
                plaintext_length=signed_as[0],
            )
            _check_variant(package, signed_as[1])
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
        # one deadline for all the attempts: the lock is held no longer than that
        have = part.stat().st_size if part.exists() else 0
        deadline = self.pace.deadline(self.clock(), info.length - have)
        for attempt in range(self.attempts):
            try:
                return download_resumable(
                    self.client,
                    url,
                    part,
                    info.length,
                    timeout=self.timeout_s,
                    bandwidth=self.bandwidth,
                    pace=self.pace,
                    deadline=deadline,
                    on_chunk=lambda done: self._chunk(name, done, info.length),
                    clock=self.clock,
                )
            except DownloadRefused as exc:  # asking again cannot help
                if exc.discard:
                    part.unlink(missing_ok=True)
                raise
            except DownloadStalled:  # the next check resumes it: the lock is released now
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
