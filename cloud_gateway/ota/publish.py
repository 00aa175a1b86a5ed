"""The over-the-air repository: signed TUF metadata and encrypted model blobs.

Layout (consistent snapshots: every metadata version and every target is a
new file, so a device reading during a publish sees one consistent state)::

    <ota>/metadata/1.root.json, 2.root.json, ...   every root version (rotation)
    <ota>/metadata/root.json                       the newest root (for enrollment)
    <ota>/metadata/<n>.targets.json, <n>.snapshot.json, timestamp.json
    <ota>/targets/models/<name>/<version>/<sha256>.payload
    <ota>/targets/keys/<group>/<name>/<sha256>.<version>.json

Publishing a model version (:meth:`OtaRepository.publish`):

1. the package (manifest, the one model file, golden data) goes into a tar
   archive, encrypted with a fresh data key into a blob
   (:mod:`edge_agent.ota.crypto`);
2. the data key is wrapped for each target group with the group's X25519 key,
   one small key file per group;
3. new targets metadata lists the blob and the key files with their lengths
   and hashes, and custom fields (model, version, groups, profiles); then new
   snapshot and timestamp metadata, each signed with its role's key.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from cloud_gateway.ota.keys import ROLES, KeyStore
from edge_agent.errors import ConfigError, PackageError
from edge_agent.fields import is_decimal
from edge_agent.ota.crypto import CHUNK_SIZE, encrypt_file, wrap_key
from edge_agent.package import MANIFEST, load_package

__all__ = ["EXPIRY_DAYS", "OtaRepository", "PublishResult", "key_target", "payload_target"]

EXPIRY_DAYS = {"root": 365, "targets": 90, "snapshot": 30, "timestamp": 7}


def payload_target(name: str, version: int) -> str:
    return f"models/{name}/{version}/payload"


def key_target(group: str, name: str, version: int) -> str:
    return f"keys/{group}/{name}/{version}.json"


@dataclass
class PublishResult:
    name: str
    version: int
    target: str
    length: int
    sha256: str
    groups: list[str]
    key_targets: dict[str, str] = field(default_factory=dict)
    targets_version: int = 0


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def _write_json_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class OtaRepository:
    def __init__(self, root: Path, keys: KeyStore | None = None) -> None:
        self.root = Path(root)
        self.keys = keys
        self.metadata_dir = self.root / "metadata"
        self.targets_dir = self.root / "targets"

    # -- reading --------------------------------------------------------------------------

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

    # -- writing --------------------------------------------------------------------------

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
        from tuf.api.metadata import Key, Metadata, MetaFile, Root, Snapshot, Targets, Timestamp

        if self.initialized():
            raise ConfigError("the OTA repository exists already", path=self.root)
        keys = self._keys()
        days = {**EXPIRY_DAYS, **(expiry_days or {})}
        self.metadata_dir.mkdir(parents=True, exist_ok=True)
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        now = _now()
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
        now = _now()
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
        from tuf.api.metadata import MetaFile

        days = {**EXPIRY_DAYS, **(expiry_days or {})}
        timestamp = self.load("timestamp")
        timestamp.signed.version += 1
        timestamp.signed.expires = _now() + timedelta(days=days["timestamp"])
        if snapshot_version is not None:
            timestamp.signed.snapshot_meta = MetaFile(version=snapshot_version)
        self._sign_and_write(timestamp, "timestamp")

    def _add_target(self, path: str, local: Path, custom: dict[str, Any]) -> Any:
        from tuf.api.metadata import TargetFile

        info = TargetFile.from_file(path, str(local), ["sha256"])
        info.unrecognized_fields["custom"] = custom
        directory, _, base = path.rpartition("/")
        destination = self.targets_dir / directory / f"{info.hashes['sha256']}.{base}"
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(local), destination)
        return info

    def publish(
        self,
        *,
        name: str,
        version: int,
        model_file: Path,
        groups: dict[str, bytes],
        profiles: list[str] | None = None,
        chunk_size: int = CHUNK_SIZE,
        expiry_days: dict[str, int] | None = None,
    ) -> PublishResult:
        """Encrypt and sign one model version for ``groups`` (group -> X25519 public key).

        ``model_file`` lives in a model package folder (with its
        ``manifest.json``); the package goes out with that one variant, its
        golden data, and its name and version set to ``name`` and ``version``.

        Raises:
            PackageError: the file is not in a valid package.
            ConfigError: the repository or the keys are missing, or the
                version exists already.
        """
        if not self.initialized():
            raise ConfigError("no OTA repository here (cloud-gateway ota init)", path=self.root)
        if not groups:
            raise ConfigError("publish to at least one group (--group)")
        target = payload_target(name, version)
        targets = self.load("targets")
        if target in targets.signed.targets:
            raise ConfigError(f"{name} version {version} is published already", path=self.root)
        with tempfile.TemporaryDirectory(dir=self.root) as tmp:
            plain, variant = _package_archive(model_file, name, version, Path(tmp))
            blob = Path(tmp) / "payload"
            data_key = os.urandom(32)
            length, digest = encrypt_file(
                plain, blob, data_key, name=name, version=version, chunk_size=chunk_size
            )
            key_targets = {group: key_target(group, name, version) for group in sorted(groups)}
            custom = {
                "model": name,
                "version": version,
                "groups": sorted(groups),
                "profiles": sorted(profiles or []),
                "variant": variant,
                "plaintext_length": plain.stat().st_size,
                "keys": key_targets,
            }
            targets.signed.targets[target] = self._add_target(target, blob, custom)
            for group, public in sorted(groups.items()):
                wrapped = wrap_key(data_key, public, name=name, version=version, group=group)
                key_file = Path(tmp) / f"key-{group}.json"
                key_file.write_text(json.dumps(wrapped, indent=2))
                path = key_targets[group]
                targets.signed.targets[path] = self._add_target(
                    path, key_file, {"model": name, "version": version, "group": group}
                )
            del data_key
        targets_version = self._commit_targets(targets, expiry_days=expiry_days)
        return PublishResult(
            name, version, target, length, digest, sorted(groups), key_targets, targets_version
        )

    def rotate(self, role: str) -> int:
        """Replace ``role``'s key: a new root version names it; returns that root version.

        The new root is signed by the root key (for the root role: by the old
        and the new root keys), so devices follow the chain of roots.
        """
        from tuf.api.metadata import Key

        if role not in ROLES:
            raise ConfigError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
        keys = self._keys()
        root = self.load("root")
        old_root_signer = keys.signer("root")
        for keyid in list(root.signed.roles[role].keyids):
            root.signed.revoke_key(keyid, role)
        signer = keys.new_key(role)
        root.signed.add_key(
            Key.from_dict(signer.public_key.keyid, signer.public_key.to_dict()), role
        )
        root.signed.version += 1
        root.signed.expires = _now() + timedelta(days=EXPIRY_DAYS["root"])
        signers = (old_root_signer, signer) if role == "root" else (old_root_signer,)
        self._sign_and_write(root, "root", *signers)
        # re-sign the chain below with the current keys
        self._commit_targets(self.load("targets"))
        return int(root.signed.version)


def _package_archive(
    model_file: Path, name: str, version: int, folder: Path
) -> tuple[Path, dict[str, Any]]:
    """A tar of the package around ``model_file``, renamed to ``name`` ``version``."""
    root = model_file.resolve().parent
    if not (root / MANIFEST).is_file():
        raise PackageError(f"{model_file} is not in a model package (no {MANIFEST} beside it)")
    package = load_package(root) if is_decimal(root.name) else _load_anywhere(root)
    variants = [v for v in package.variants if v.file == model_file.name]
    if not variants:
        raise PackageError(f"{model_file.name} is not a variant of {package.qualified_name}")
    package.read_variant(variants[0])  # checks the file against the manifest's hash
    manifest = package.to_dict()
    manifest.update(name=name, version=version, variants=[variants[0].to_dict()])
    archive = folder / "payload.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:

        def add(member: str, data: bytes | None = None, path: Path | None = None) -> None:
            info = tarfile.TarInfo(member)
            info.mode = 0o600
            if path is not None:
                info.size = path.stat().st_size
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
            else:
                assert data is not None
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

        add(MANIFEST, data=json.dumps(manifest, indent=2).encode())
        add(variants[0].file, path=package.path_of(variants[0]))
        if package.golden_file and (root / package.golden_file).is_file():
            add(package.golden_file, path=root / package.golden_file)
    return archive, {
        "id": variants[0].id,
        "format": variants[0].format,
        "precision": variants[0].precision,
    }


def _load_anywhere(root: Path) -> Any:
    """Load a package whose folder is not named by its version."""
    with tempfile.TemporaryDirectory() as tmp:
        manifest = json.loads((root / MANIFEST).read_text())
        link = Path(tmp) / str(manifest.get("version", 1))
        link.symlink_to(root, target_is_directory=True)
        package = load_package(link)
    from dataclasses import replace

    return replace(package, root=root)
