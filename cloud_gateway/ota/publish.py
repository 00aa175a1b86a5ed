"""The over-the-air repository: signed TUF metadata and encrypted model blobs.

The signed metadata (TUF roles, signing, refresh, rotation) is
:class:`~cloud_gateway.ota.metadata.SignedRepository`'s; this module adds the models.
Targets (consistent snapshots: every target is a new file)::

    <ota>/targets/models/<name>/<version>/<sha256>.payload
    <ota>/targets/keys/<group>/<name>/<sha256>.<version>.json

Publishing a model version (:meth:`OtaRepository.publish`):

1. the package (manifest, the one model file, golden data) goes into a tar
   archive, encrypted with a fresh data key into a blob
   (:mod:`edge_core.ota.crypto`);
2. the data key is wrapped for each target group with the group's X25519 key,
   one small key file per group;
3. new targets metadata lists the blob and the key files with their lengths
   and hashes, and custom fields (model, version, groups, profiles); then new
   snapshot and timestamp metadata, each signed with its role's key.

Withdrawing a version (:meth:`OtaRepository.withdraw`) signs new targets
metadata that keeps the blob listed but marks it ``"withdrawn": true``: a
device refuses to install it and, if it runs it, goes back to its previous
version. This signature is the only thing that moves a device back (the
gateway's plan is not signed).

Every change runs under the repository's lock. Names are held to
:data:`edge_core.names.MODEL_NAME`, groups to the rule of ``device add``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloud_gateway.auth import DEVICE_ID
from cloud_gateway.ota.archive import package_archive
from cloud_gateway.ota.metadata import (
    EXPIRY_DAYS,
    REFRESH_MARGIN,
    ROOT_NOTICE_DAYS,
    RefreshResult,
    SignedRepository,
    due_roles,
)
from edge_core.errors import ConfigError
from edge_core.names import MAX_VERSION, MODEL_NAME_RULE, is_model_name
from edge_core.ota.crypto import CHUNK_SIZE, encrypt_file, wrap_key
from edge_core.ota.plan import key_target, payload_target

__all__ = [
    "EXPIRY_DAYS",
    "REFRESH_MARGIN",
    "ROOT_NOTICE_DAYS",
    "OtaRepository",
    "PublishResult",
    "RefreshResult",
    "due_roles",
    "key_target",
    "payload_target",
]


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


class OtaRepository(SignedRepository):
    """The repository with its models: publish and withdraw versions."""

    def _add_target(self, path: str, local: Path, custom: dict[str, Any]) -> Any:
        from tuf.api.metadata import TargetFile

        info = TargetFile.from_file(path, str(local), ["sha256"])
        info.unrecognized_fields["custom"] = custom
        directory, _, base = path.rpartition("/")
        destination = self.targets_dir / directory / f"{info.hashes['sha256']}.{base}"
        destination.parent.mkdir(parents=True, exist_ok=True)
        with local.open("rb") as handle:
            os.fsync(handle.fileno())  # whole on disk before it has a name a device can ask for
        # a rename within the repository's filesystem (the temporary folder is inside it):
        # a replica reading the shared folder sees no file, or the whole file
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
        if not is_model_name(name):
            raise ConfigError(f"model name {name!r}: expected {MODEL_NAME_RULE}")
        if (
            isinstance(version, bool)
            or not isinstance(version, int)
            or not 1 <= version <= MAX_VERSION
        ):
            raise ConfigError(f"version {version!r}: expected an integer from 1 to {MAX_VERSION}")
        if not groups:
            raise ConfigError("publish to at least one group (--group)")
        for group in groups:
            if DEVICE_ID.fullmatch(group) is None:
                raise ConfigError(f"group {group!r}: expected 1-64 letters, digits, '-' or '_'")
        with self._locked():
            return self._publish(
                name, version, model_file, groups, profiles, chunk_size, expiry_days
            )

    def _publish(
        self,
        name: str,
        version: int,
        model_file: Path,
        groups: dict[str, bytes],
        profiles: list[str] | None,
        chunk_size: int,
        expiry_days: dict[str, int] | None,
    ) -> PublishResult:
        if not self.initialized():
            raise ConfigError("no OTA repository here (cloud-gateway ota init)", path=self.root)
        target = payload_target(name, version)
        targets = self.load("targets")
        if target in targets.signed.targets:
            raise ConfigError(f"{name} version {version} is published already", path=self.root)
        with tempfile.TemporaryDirectory(dir=self.root) as tmp:
            plain, variant = package_archive(model_file, name, version, Path(tmp))
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

    def withdraw(
        self, name: str, version: int, *, expiry_days: dict[str, int] | None = None
    ) -> int:
        """Mark ``name`` ``version`` withdrawn in new signed metadata; returns the targets version.

        The blob stays listed (devices that run it can tell it was taken back,
        not lost) with ``"withdrawn": true`` in its custom fields.

        Raises:
            ConfigError: it is not published, or withdrawn already.
        """
        with self._locked():
            if not self.initialized():
                raise ConfigError("no OTA repository here", path=self.root)
            targets = self.load("targets")
            info = targets.signed.targets.get(payload_target(name, version))
            if info is None:
                raise ConfigError(f"{name} version {version} is not published", path=self.root)
            custom = info.unrecognized_fields.setdefault("custom", {})
            if custom.get("withdrawn") is True:
                raise ConfigError(f"{name} version {version} is withdrawn already", path=self.root)
            custom["withdrawn"] = True
            custom["withdrawn_at"] = self._clock().isoformat()
            return self._commit_targets(targets, expiry_days=expiry_days)
