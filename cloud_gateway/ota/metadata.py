"""The over-the-air repository's signed metadata (TUF, through python-tuf's metadata
API): the four roles' files, signing under a lock, keeping them fresh, key rotation.
:class:`~cloud_gateway.ota.publish.OtaRepository` adds the models (encrypted blobs and
their key files) on top.

Layout (consistent snapshots: every metadata version and every target is a
new file, so a device reading during a publish sees one consistent state)::

    <ota>/metadata/1.root.json, 2.root.json, ...   every root version (rotation)
    <ota>/metadata/root.json                       the newest root (for enrollment)
    <ota>/metadata/<n>.targets.json, <n>.snapshot.json, timestamp.json

Keeping the metadata fresh (:meth:`SignedRepository.refresh`, ``cloud-gateway ota
refresh``, run daily by a timer): every role's metadata expires
(:data:`EXPIRY_DAYS`), and a device refuses expired metadata (a freeze attack
looks the same as a repository nobody signs any more). A refresh signs a new
timestamp every time, and new snapshot and targets versions when fewer than
:data:`REFRESH_MARGIN` of their lifetime is left (new targets need a new
snapshot, a new snapshot a new timestamp). A refresh never signs the root:
renewing the trust anchor is an operator's deliberate act (``keys rotate
--role root``), and the refresh says when fewer than :data:`ROOT_NOTICE_DAYS`
are left.

Every change of the metadata is a read-modify-write of the newest versions,
so it runs under an ``flock`` on ``<ota>/.lock``: two publishers (or a
publish and a rotation) never sign the same version twice.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from cloud_gateway.ota.keys import ROLES, KeyStore
from edge_core.errors import ConfigError
from edge_core.fields import is_decimal

__all__ = [
    "EXPIRY_DAYS",
    "REFRESH_MARGIN",
    "ROOT_NOTICE_DAYS",
    "RefreshResult",
    "SignedRepository",
    "due_roles",
]

EXPIRY_DAYS = {"root": 365, "targets": 90, "snapshot": 30, "timestamp": 7}
REFRESH_MARGIN = 0.5  # re-sign snapshot and targets when less than this share of life is left
ROOT_NOTICE_DAYS = 60  # say so when the root has fewer days left (it is rotated by hand)


@dataclass(frozen=True)
class RefreshResult:
    """What :meth:`OtaRepository.refresh` signed, and when each role expires now.

    ``root_due``: the root expires within :data:`ROOT_NOTICE_DAYS`; an operator
    renews it by hand (``cloud-gateway keys rotate --role root``).
    """

    signed: list[str]
    expires: dict[str, datetime]
    root_due: bool


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def due_roles(
    expires: dict[str, datetime],
    now: datetime,
    *,
    days: dict[str, int] | None = None,
    margin: float = REFRESH_MARGIN,
) -> list[str]:
    """The roles a refresh signs again: the timestamp always, and below it every role
    with less than ``margin`` of its lifetime (``days``) left, with the roles that name
    it (new targets need a new snapshot). Pure: ``expires`` maps role -> expiry."""
    lifetime = {**EXPIRY_DAYS, **(days or {})}

    def due(role: str) -> bool:
        return expires[role] - now < timedelta(days=lifetime[role]) * margin

    if due("targets"):
        return ["targets", "snapshot", "timestamp"]
    if due("snapshot"):
        return ["snapshot", "timestamp"]
    return ["timestamp"]


def _write_json_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class SignedRepository:
    """A repository in ``root``, signed with ``keys``; ``clock`` is the time it signs at
    (UTC, whole seconds; the tests move it)."""

    def __init__(
        self,
        root: Path,
        keys: KeyStore | None = None,
        *,
        clock: Callable[[], datetime] = _now,
    ) -> None:
        self.root = Path(root)
        self.keys = keys
        self._clock = clock
        self.metadata_dir = self.root / "metadata"
        self.targets_dir = self.root / "targets"
        self._thread_lock = threading.RLock()
        self._depth = 0

    def initialized(self) -> bool:
        return (self.metadata_dir / "timestamp.json").is_file()

    def _latest_version(self, role: str) -> int:
        versions = [
            int(p.name.split(".", 1)[0])
            for p in self.metadata_dir.glob(f"*.{role}.json")
            if is_decimal(p.name.split(".", 1)[0])
        ]
        if not versions:
            raise ConfigError(f"the OTA repository has no {role} metadata", path=self.root)
        return max(versions)

    def load(self, role: str) -> Any:
        from tuf.api.metadata import Metadata

        if role == "timestamp":
            return Metadata.from_file(str(self.metadata_dir / "timestamp.json"))
        return Metadata.from_file(
            str(self.metadata_dir / f"{self._latest_version(role)}.{role}.json")
        )

    def root_bytes(self) -> bytes:
        """The newest root metadata, the trust anchor of enrollment bundles."""
        return (self.metadata_dir / "root.json").read_bytes()

    def targets(self) -> dict[str, Any]:
        """Target path -> TargetFile of the current targets metadata."""
        return dict(self.load("targets").signed.targets)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold ``<ota>/.lock`` for a whole read-modify-write of the metadata (re-entrant)."""
        with self._thread_lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._depth = 1
                try:
                    self._finish_rotation()
                    yield
                finally:
                    self._depth = 0
            finally:
                os.close(fd)

    def _keys(self) -> KeyStore:
        if self.keys is None:
            raise ConfigError("signing keys are needed (--keys DIR)")
        return self.keys

    def _sign_and_write(self, metadata: Any, role: str, *signers: Any) -> None:
        from tuf.api.serialization.json import JSONSerializer

        metadata.signatures.clear()
        for signer in signers or (self._keys().signer(role),):
            metadata.sign(signer, append=True)
        data = JSONSerializer(compact=False).serialize(metadata)
        if role == "timestamp":
            _write_json_atomically(self.metadata_dir / "timestamp.json", data)
            return
        _write_json_atomically(self.metadata_dir / f"{metadata.signed.version}.{role}.json", data)
        if role == "root":
            _write_json_atomically(self.metadata_dir / "root.json", data)

    def init(self, *, expiry_days: dict[str, int] | None = None) -> None:
        """A new repository: root (naming the four role keys), empty targets, snapshot, timestamp.

        Raises:
            ConfigError: it exists already, or the keys are missing.
        """
        with self._locked():
            self._init(expiry_days)

    def _init(self, expiry_days: dict[str, int] | None) -> None:
        from tuf.api.metadata import Key, Metadata, MetaFile, Root, Snapshot, Targets, Timestamp

        if self.initialized():
            raise ConfigError("the OTA repository exists already", path=self.root)
        keys = self._keys()
        days = {**EXPIRY_DAYS, **(expiry_days or {})}
        self.metadata_dir.mkdir(parents=True, exist_ok=True)
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        now = self._clock()
        root = Root(expires=now + timedelta(days=days["root"]), consistent_snapshot=True)
        for role in ROLES:
            signer = keys.signer(role)
            root.add_key(Key.from_dict(signer.public_key.keyid, signer.public_key.to_dict()), role)
        self._sign_and_write(Metadata(root), "root")
        targets = Metadata(Targets(expires=now + timedelta(days=days["targets"])))
        self._sign_and_write(targets, "targets")
        snapshot = Snapshot(expires=now + timedelta(days=days["snapshot"]))
        snapshot.meta["targets.json"] = MetaFile(version=targets.signed.version)
        self._sign_and_write(Metadata(snapshot), "snapshot")
        timestamp = Timestamp(expires=now + timedelta(days=days["timestamp"]))
        timestamp.snapshot_meta = MetaFile(version=1)
        self._sign_and_write(Metadata(timestamp), "timestamp")

    def _commit_targets(self, targets: Any, *, expiry_days: dict[str, int] | None = None) -> int:
        """Sign new targets, snapshot and timestamp versions; returns the targets version."""
        from tuf.api.metadata import MetaFile

        days = {**EXPIRY_DAYS, **(expiry_days or {})}
        now = self._clock()
        targets.signed.version += 1
        targets.signed.expires = now + timedelta(days=days["targets"])
        self._sign_and_write(targets, "targets")
        snapshot = self.load("snapshot")
        snapshot.signed.version += 1
        snapshot.signed.expires = now + timedelta(days=days["snapshot"])
        snapshot.signed.meta["targets.json"] = MetaFile(version=targets.signed.version)
        self._sign_and_write(snapshot, "snapshot")
        self.refresh_timestamp(snapshot_version=snapshot.signed.version, expiry_days=days)
        return int(targets.signed.version)

    def refresh_timestamp(
        self, *, snapshot_version: int | None = None, expiry_days: dict[str, int] | None = None
    ) -> None:
        """A new timestamp version (run before the current one expires)."""
        with self._locked():
            self._timestamp(snapshot_version, expiry_days)

    def _timestamp(self, snapshot_version: int | None, expiry_days: dict[str, int] | None) -> None:
        from tuf.api.metadata import MetaFile

        days = {**EXPIRY_DAYS, **(expiry_days or {})}
        timestamp = self.load("timestamp")
        timestamp.signed.version += 1
        timestamp.signed.expires = self._clock() + timedelta(days=days["timestamp"])
        if snapshot_version is not None:
            timestamp.signed.snapshot_meta = MetaFile(version=snapshot_version)
        self._sign_and_write(timestamp, "timestamp")

    def refresh(
        self, *, margin: float = REFRESH_MARGIN, expiry_days: dict[str, int] | None = None
    ) -> RefreshResult:
        """Sign new versions of what expires soon: the timestamp always, snapshot and
        targets when less than ``margin`` of their lifetime is left (:func:`due_roles`).

        Run it well within the timestamp's lifetime (daily): a device refuses
        expired metadata. The root is never signed here (see :class:`RefreshResult`).

        Raises:
            ConfigError: no repository here, or the keys are missing.
        """
        from tuf.api.metadata import MetaFile

        with self._locked():
            if not self.initialized():
                raise ConfigError("no OTA repository here (cloud-gateway ota init)", path=self.root)
            days = {**EXPIRY_DAYS, **(expiry_days or {})}
            expires = {role: self.load(role).signed.expires for role in ROLES}
            signed = due_roles(expires, self._clock(), days=days, margin=margin)
            if "targets" in signed:
                self._commit_targets(self.load("targets"), expiry_days=days)
            elif "snapshot" in signed:
                snapshot = self.load("snapshot")
                snapshot.signed.version += 1
                snapshot.signed.expires = self._clock() + timedelta(days=days["snapshot"])
                snapshot.signed.meta["targets.json"] = MetaFile(
                    version=self._latest_version("targets")
                )
                self._sign_and_write(snapshot, "snapshot")
                self._timestamp(snapshot.signed.version, days)
            else:
                self._timestamp(None, days)
            expires = {role: self.load(role).signed.expires for role in ROLES}
            root_due = expires["root"] - self._clock() < timedelta(days=ROOT_NOTICE_DAYS)
            return RefreshResult(signed, expires, root_due)

    def rotate(self, role: str) -> int:
        """Replace ``role``'s key: a new root version names it; returns that root version.

        The new root is signed by the root key (for the root role: by the old
        and the new root keys), so devices follow the chain of roots. The new
        key is staged beside the old one, the new root written, and only then
        does the new key replace the old: a crash at any point leaves a key
        that the newest root names (:meth:`_finish_rotation` completes it).
        """
        from tuf.api.metadata import Key

        if role not in ROLES:
            raise ConfigError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
        with self._locked():
            keys = self._keys()
            root = self.load("root")
            old_root_signer = keys.signer("root")
            signer = keys.stage(role)
            for keyid in list(root.signed.roles[role].keyids):
                root.signed.revoke_key(keyid, role)
            root.signed.add_key(
                Key.from_dict(signer.public_key.keyid, signer.public_key.to_dict()), role
            )
            root.signed.version += 1
            root.signed.expires = self._clock() + timedelta(days=EXPIRY_DAYS["root"])
            signers = (old_root_signer, signer) if role == "root" else (old_root_signer,)
            self._sign_and_write(root, "root", *signers)
            keys.commit(role)
            # re-sign the chain below with the current keys
            self._commit_targets(self.load("targets"))
            return int(root.signed.version)

    def _finish_rotation(self) -> None:
        """Complete, or forget, a key rotation that a crash interrupted (under the lock).

        A staged key that the newest root names replaces the old key, and the
        metadata below is signed again with it; one that no root names was
        never used and is dropped.
        """
        keys = self.keys
        if keys is None or not self.initialized():
            return
        root = None
        finished = False
        for role in ROLES:
            staged = keys.staged(role)
            if staged is None:
                continue
            root = root or self.load("root")
            if staged.public_key.keyid in root.signed.roles[role].keyids:
                keys.commit(role)
                finished = True
            else:
                keys.discard(role)
        if finished:
            self._commit_targets(self.load("targets"))
