"""What the OTA repository publishes, read from its newest targets metadata.

The dashboard shows it (:func:`published_versions`), and the update service holds
device reports to it (:class:`PublishedIndex`): a device may report only on a
version published for its own group. Read, never trusted: devices verify the
signatures; the gateway reads what it serves, and a file it cannot parse
publishes nothing.

:class:`PublishedIndex` reads the metadata again only when a new version of it
is signed: every change (a publish, a withdrawal, a refresh) ends by replacing
``timestamp.json``, whose identity (inode, size, time) is checked at each
lookup, so a report costs a ``stat`` rather than a parse, and replicas reading
a shared folder see each other's publishes at once.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from edge_core.fields import is_decimal

__all__ = ["PublishedIndex", "published_versions"]


def published_versions(ota_repository: Path | None) -> list[dict[str, Any]]:
    """The model versions in the OTA repository's newest targets metadata, each with its
    groups, profiles, variant and whether it is withdrawn; newest version first."""
    if ota_repository is None:
        return []
    folder = ota_repository / "metadata"
    numbered = [
        (int(p.name.split(".", 1)[0]), p)
        for p in folder.glob("*.targets.json")
        if is_decimal(p.name.split(".", 1)[0])
    ]
    if not numbered:
        return []
    try:
        document = json.loads(max(numbered)[1].read_text())
        targets = document["signed"]["targets"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if not isinstance(targets, dict):
        return []
    out = []
    for path, info in targets.items():
        custom = info.get("custom") if isinstance(info, dict) else None
        if not path.startswith("models/") or not isinstance(custom, dict):
            continue
        found = custom.get("variant")
        variant: dict[str, Any] = found if isinstance(found, dict) else {}
        groups = custom.get("groups", [])
        profiles = custom.get("profiles", [])
        out.append(
            {
                "name": str(custom.get("model", "")),
                "version": int(custom.get("version", 0) or 0),
                "groups": [str(g) for g in groups] if isinstance(groups, list) else [],
                "profiles": [str(p) for p in profiles] if isinstance(profiles, list) else [],
                "variant": str(variant.get("id", "")),
                "precision": str(variant.get("precision", "")),
                "format": str(variant.get("format", "")),
                "size": custom.get("size", custom.get("plaintext_length")),
                "accuracy": custom.get("accuracy"),
                "withdrawn": custom.get("withdrawn") is True,
            }
        )
    return sorted(out, key=lambda v: (v["name"], -v["version"]))


class PublishedIndex:
    """Which (model, version) pairs each group was published, kept until the repository
    signs new metadata (see the module docstring). Thread-safe."""

    def __init__(self, ota_repository: Path) -> None:
        self.repository = Path(ota_repository)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._offered: frozenset[tuple[str, str, int]] = frozenset()

    def _current(self) -> frozenset[tuple[str, str, int]]:
        try:
            found = os.stat(self.repository / "metadata" / "timestamp.json")
            stamp: tuple[int, int, int] | None = (found.st_ino, found.st_size, found.st_mtime_ns)
        except OSError:
            stamp = None  # no repository yet: nothing is published
        with self._lock:
            if stamp != self._stamp:
                self._offered = frozenset(
                    (group, version["name"], version["version"])
                    for version in published_versions(self.repository if stamp else None)
                    for group in version["groups"]
                )
                self._stamp = stamp
            return self._offered

    def offered(self, group: str, name: str, version: int) -> bool:
        """Whether ``name`` ``version`` is published for ``group`` (withdrawn ones too: a
        device that leaves a withdrawn version says so)."""
        return (group, name, version) in self._current()
