"""Signing keys of the update metadata roles (Ed25519), kept in one directory.

``cloud-gateway keys init --dir DIR`` writes, for each of the four TUF roles
(root, targets, snapshot, timestamp), ``<role>.key`` (the private key, PKCS#8
PEM, mode 0600) and ``<role>.pub`` (the public key as TUF metadata JSON). The
root key signs the root metadata, which names the keys of every role: rotating
a role's key is a new root version signed by the root key (and, for the root
key itself, by the old and the new one), see :mod:`cloud_gateway.ota.publish`.

A rotation never leaves the repository without a key that signs: the new
key is first *staged* (``<role>.key.new``), the new root naming it is
written, and only then does the staged key replace the old one
(:meth:`KeyStore.commit`). A crash in between leaves both; the repository
finishes or forgets the staged key by what its root names.

Keep the root key offline; the gateway needs only the timestamp and snapshot
keys online to refresh their metadata.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from cloud_gateway.auth import write_private
from edge_core.errors import ConfigError

__all__ = ["ROLES", "KeyStore"]

ROLES = ("root", "targets", "snapshot", "timestamp")


def _has_metadata(repository: Path) -> bool:
    folder = repository / "metadata"
    return folder.is_dir() and any(folder.glob("*.json"))


class KeyStore:
    """The role keys in ``root`` (a directory)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _private(self, role: str) -> Path:
        return self.root / f"{role}.key"

    def _staged(self, role: str) -> Path:
        return self.root / f"{role}.key.new"

    def exists(self) -> bool:
        return all(self._private(role).is_file() for role in ROLES)

    def init(self, *, force: bool = False, repository: Path | None = None) -> None:
        """Create a key for every role.

        ``force`` replaces existing keys, but only for a repository that has no
        metadata yet, named by ``repository``: devices enrolled with a
        repository trust its keys, and a key replaced under it could never sign
        for them again (``keys rotate`` replaces a key in use). The keys
        replaced are kept in ``retired-<time>/``, never destroyed.

        Raises:
            ConfigError: keys are there already and ``force`` is off, or
                ``force`` without ``repository``, or ``repository`` has metadata.
        """
        existing = [role for role in ROLES if self._private(role).exists()]
        if existing and not force:
            raise ConfigError(
                "signing keys exist already; refusing to overwrite them", path=self.root
            )
        if existing and repository is None:
            raise ConfigError(
                "--force replaces keys a repository may trust: name the repository they are "
                "for with --repository OTA_DIR (it must have no metadata yet); to replace a "
                "key that a repository uses, run `cloud-gateway keys rotate`",
                path=self.root,
            )
        if existing and repository is not None and _has_metadata(repository):
            raise ConfigError(
                f"the repository {repository} has metadata signed with these keys, and its "
                "devices trust them: refusing to replace them (`cloud-gateway keys rotate` "
                "replaces a key in use)",
                path=self.root,
            )
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)
        if existing:
            retired = self.root / f"retired-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
            retired.mkdir(mode=0o700)
            for role in ROLES:
                for path in (self._private(role), self.root / f"{role}.pub"):
                    if path.exists():
                        os.replace(path, retired / path.name)
        for role in ROLES:
            self.new_key(role)

    def new_key(self, role: str) -> Any:
        """Generate (and store) a new key for ``role``; returns its signer."""
        from securesystemslib.signer import CryptoSigner

        signer = CryptoSigner.generate_ed25519()
        write_private(self._private(role), signer.private_bytes)
        self._write_public(role, signer)
        return signer

    def _write_public(self, role: str, signer: Any) -> None:
        public = json.dumps(signer.public_key.to_dict(), indent=2).encode()
        path = self.root / f"{role}.pub"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(public)
        os.replace(tmp, path)

    def stage(self, role: str) -> Any:
        """A new key for ``role``, stored beside the current one (``<role>.key.new``)."""
        from securesystemslib.signer import CryptoSigner

        signer = CryptoSigner.generate_ed25519()
        write_private(self._staged(role), signer.private_bytes)
        return signer

    def staged(self, role: str) -> Any:
        """The signer of ``role``'s staged key, or ``None`` if none is staged."""
        return self._load(self._staged(role), role) if self._staged(role).is_file() else None

    def commit(self, role: str) -> None:
        """Make the staged key ``role``'s key (one atomic rename)."""
        signer = self._load(self._staged(role), role)
        os.replace(self._staged(role), self._private(role))
        self._write_public(role, signer)

    def discard(self, role: str) -> None:
        """Forget a staged key that no root names."""
        self._staged(role).unlink(missing_ok=True)

    def signer(self, role: str) -> Any:
        """The signer of ``role``'s current key.

        Raises:
            ConfigError: the key file is missing or not a private key.
        """
        return self._load(self._private(role), role)

    def _load(self, path: Path, role: str) -> Any:
        from cryptography.hazmat.primitives.serialization import load_pem_private_key
        from securesystemslib.signer import CryptoSigner

        try:
            key = load_pem_private_key(path.read_bytes(), password=None)
        except FileNotFoundError:
            raise ConfigError(
                f"no {role} key (cloud-gateway keys init --dir {self.root})", path=path
            ) from None
        except ValueError as exc:
            raise ConfigError(f"not a private key: {exc}", path=path) from exc
        return CryptoSigner(key)
