"""Device groups' key pairs (X25519) and enrollment bundles.

Each group has one key pair, made when its first device is added and kept in
``<state>/groups/<group>.json`` (mode 0600). Models are published for groups:
their data keys are wrapped with the group's public key. A device receives its
group's private key in its *enrollment bundle*, with its token and the
trusted root metadata of the update repository: everything it needs to
authenticate, verify and decrypt, in one file at mode 0600.

A group's key is made once, whoever asks first: it is written whole to a
file of its own and *linked* into place, which fails if a key is there
already; then the one in place is read. So devices added at the same time
(two ``device add`` processes) get the same key.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from pathlib import Path
from typing import Any

from cloud_gateway.auth import DEVICE_ID, write_private
from edge_core.ota.crypto import generate_group_key

__all__ = ["GroupKeys", "write_bundle"]


class GroupKeys:
    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir) / "groups"

    def _path(self, group: str) -> Path:
        """The group's key file.

        Raises:
            ValueError: not a group name (the rule of ``device add``).
        """
        if DEVICE_ID.fullmatch(group) is None:
            raise ValueError(f"group {group!r} must be 1-64 letters, digits, '-' or '_'")
        return self.dir / f"{group}.json"

    def ensure(self, group: str) -> tuple[bytes, bytes]:
        """The group's (private, public) key pair, made on first use (once, atomically).

        Raises:
            ValueError: not a group name.
        """
        path = self._path(group)
        if not path.is_file():
            self._create(path, group)
        data = json.loads(path.read_text())
        return base64.b64decode(data["private"]), base64.b64decode(data["public"])

    def _create(self, path: Path, group: str) -> None:
        private, public = generate_group_key()
        document = {
            "group": group,
            "algorithm": "X25519",
            "private": base64.b64encode(private).decode(),
            "public": base64.b64encode(public).decode(),
        }
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{group}.{uuid.uuid4().hex}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(json.dumps(document, indent=2).encode())
                handle.flush()
                os.fsync(handle.fileno())
            try:
                os.link(tmp, path)  # fails if another process made the key first: theirs wins
            except FileExistsError:
                return
            folder = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(folder)  # the new name survives a power cut
            finally:
                os.close(folder)
        finally:
            tmp.unlink(missing_ok=True)

    def public(self, group: str) -> bytes:
        """The group's public key.

        Raises:
            KeyError: the group has no devices (no key) yet.
        """
        path = self._path(group)
        if not path.is_file():
            raise KeyError(
                f"group {group!r} has no key in {self.dir} yet: add a device to it first "
                "(`device add ID --group G`), or name the gateway's state directory, where "
                "`device add` made it (--config FILE or --state-dir DIR)"
            )
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
