"""Signing keys of the update metadata roles (Ed25519), kept in one directory.

``cloud-gateway keys init --dir DIR`` writes, for each of the four TUF roles
(root, targets, snapshot, timestamp), ``<role>.key`` (the private key, PKCS#8
PEM, mode 0600) and ``<role>.pub`` (the public key as TUF metadata JSON). The
root key signs the root metadata, which names the keys of every role: rotating
a role's key is a new root version signed by the root key (and, for the root
key itself, by the old and the new one), see :mod:`cloud_gateway.ota.publish`.

Keep the root key offline; the gateway needs only the timestamp and snapshot
keys online to refresh their metadata.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cloud_gateway.auth import write_private
from edge_agent.errors import ConfigError

__all__ = ["ROLES", "KeyStore"]

ROLES = ("root", "targets", "snapshot", "timestamp")


class KeyStore:
    """The role keys in ``root`` (a directory)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _private(self, role: str) -> Path:
        return self.root / f"{role}.key"

    def exists(self) -> bool:
        return all(self._private(role).is_file() for role in ROLES)

    def init(self, *, force: bool = False) -> None:
        """Create a key for every role.

        Raises:
            ConfigError: keys are there already (and ``force`` is off).
        """
        if not force and any(self._private(role).exists() for role in ROLES):
            raise ConfigError(
                "signing keys exist already; refusing to overwrite them", path=self.root
            )
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)
        for role in ROLES:
            self.new_key(role)

    def new_key(self, role: str) -> Any:
        """Generate (and store) a new key for ``role``; returns its signer."""
        from securesystemslib.signer import CryptoSigner

        signer = CryptoSigner.generate_ed25519()
        write_private(self._private(role), signer.private_bytes)
        (self.root / f"{role}.pub").write_text(json.dumps(signer.public_key.to_dict(), indent=2))
        return signer

    def signer(self, role: str) -> Any:
        """The signer of ``role``'s current key.

        Raises:
            ConfigError: the key file is missing or not a private key.
        """
        from cryptography.hazmat.primitives.serialization import load_pem_private_key
        from securesystemslib.signer import CryptoSigner

        path = self._private(role)
        try:
            key = load_pem_private_key(path.read_bytes(), password=None)
        except FileNotFoundError:
            raise ConfigError(
                f"no {role} key (cloud-gateway keys init --dir {self.root})", path=path
            ) from None
        except ValueError as exc:
            raise ConfigError(f"not a private key: {exc}", path=path) from exc
        return CryptoSigner(key)
