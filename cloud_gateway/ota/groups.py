"""Device groups' key pairs (X25519) and enrollment bundles.

Each group has one key pair, made when its first device is added and kept in
``<state>/groups/<group>.json`` (mode 0600). Models are published for groups:
their data keys are wrapped with the group's public key. A device receives its
group's private key in its *enrollment bundle*, with its token and the
trusted root metadata of the update repository: everything it needs to
authenticate, verify and decrypt, in one file at mode 0600.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from cloud_gateway.auth import write_private
from edge_agent.ota.crypto import generate_group_key

__all__ = ["GroupKeys", "write_bundle"]


class GroupKeys:
    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir) / "groups"

    def _path(self, group: str) -> Path:
        return self.dir / f"{group}.json"

    def ensure(self, group: str) -> tuple[bytes, bytes]:
        """The group's (private, public) key pair, made on first use."""
        path = self._path(group)
        if path.is_file():
            data = json.loads(path.read_text())
            return base64.b64decode(data["private"]), base64.b64decode(data["public"])
        private, public = generate_group_key()
        document = {
            "group": group,
            "algorithm": "X25519",
            "private": base64.b64encode(private).decode(),
            "public": base64.b64encode(public).decode(),
        }
        write_private(path, json.dumps(document, indent=2).encode())
        return private, public

    def public(self, group: str) -> bytes:
        """The group's public key.

        Raises:
            KeyError: the group has no devices (no key) yet.
        """
        path = self._path(group)
        if not path.is_file():
            raise KeyError(f"group {group!r} has no key yet: add a device to it first")
        return base64.b64decode(json.loads(path.read_text())["public"])

    def groups(self) -> list[str]:
        return sorted(p.stem for p in self.dir.glob("*.json")) if self.dir.is_dir() else []


def write_bundle(
    path: Path,
    *,
    device_id: str,
    group: str,
    token: str,
    group_private: bytes,
    trusted_root: bytes | None,
    gateway: str | None,
) -> dict[str, Any]:
    """Write a device's enrollment bundle (mode 0600)."""
    bundle: dict[str, Any] = {
        "version": 1,
        "device_id": device_id,
        "group": group,
        "token": token,
        "group_key": base64.b64encode(group_private).decode(),
        "trusted_root": json.loads(trusted_root) if trusted_root else None,
        "gateway": gateway,
    }
    write_private(path, json.dumps(bundle, indent=2).encode())
    return bundle
