"""The enrollment bundle: what a device is given when it joins the fleet.

One JSON file, mode 0600 (``cloud-gateway device add`` writes it): the
device's id, group and token, its group's X25519 private key (to unwrap model
data keys) and the update repository's trusted root metadata (the anchor of
every signature check).
"""

from __future__ import annotations

import base64
import json
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_core.errors import ConfigError

__all__ = ["Enrollment", "load_bundle"]


@dataclass(frozen=True)
class Enrollment:
    device_id: str
    group: str
    token: str
    group_key: bytes
    trusted_root: bytes | None
    gateway: str | None
    source: Path | None = None


def load_bundle(path: Path) -> Enrollment:
    """Read and check an enrollment bundle.

    Raises:
        ConfigError: missing, readable by others, or malformed.
    """
    try:
        mode = path.stat().st_mode
        document: Any = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("enrollment bundle not found", path=path) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"unreadable enrollment bundle: {exc}", path=path) from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"the bundle holds secrets but is readable by others (mode {oct(mode & 0o777)}); "
            "expected 0600",
            path=path,
        )
    try:
        root = document.get("trusted_root")
        return Enrollment(
            device_id=str(document["device_id"]),
            group=str(document["group"]),
            token=str(document["token"]),
            group_key=base64.b64decode(document["group_key"], validate=True),
            trusted_root=json.dumps(root).encode() if root else None,
            gateway=document.get("gateway"),
            source=path,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"malformed enrollment bundle: {exc!r}", path=path) from None
