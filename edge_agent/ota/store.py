"""Installed models, in two slots per model, switched atomically.

::

    <state>/ota/models/<name>/a/      payload (the encrypted blob, as downloaded)
                              key.json (its data key, wrapped for the group)
                              meta.json (name, version, hashes: written last)
    <state>/ota/models/<name>/b/      the other version
    <state>/ota/models/<name>/active  -> a   (a symbolic link, replaced atomically)

An update is written to the slot that is not active, flushed to disk
(files, then the folder), smoke-tested, and only then the ``active`` link is
replaced by a new one with one ``rename``: whenever the device stops, even by
``kill -9`` or a power cut, ``active`` names a complete slot, old or new. The
other slot keeps the previous version for rollback.

Models stay encrypted at rest: :meth:`OtaStore.package` unwraps the data key
with the group's private key and decrypts the blob into memory, where both
runtimes load models from bytes. No plaintext model touches the disk.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_agent.errors import IntegrityError, ModelNotFoundError, PackageError
from edge_agent.ota.crypto import decrypt_blob, unwrap_key
from edge_agent.package import ModelPackage, package_from_files

__all__ = ["OtaStore", "SlotInfo", "fsync_dir"]

SLOTS = ("a", "b")
MAX_MEMBERS = 16


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with path.open("rb") as handle:
        os.fsync(handle.fileno())


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


@dataclass(frozen=True)
class SlotInfo:
    name: str
    version: int
    slot: str
    path: Path
    sha256: str
    length: int
    installed_at: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "slot": self.slot,
            "sha256": self.sha256,
            "length": self.length,
            "installed_at": self.installed_at,
        }


class OtaStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.models = self.root / "models"
        self.downloads = self.root / "downloads"
        self.metadata = self.root / "tuf"
        for folder in (self.models, self.downloads, self.metadata):
            folder.mkdir(parents=True, exist_ok=True)

    # -- reading ----------------------------------------------------------------------------

    def names(self) -> list[str]:
        return sorted(p.name for p in self.models.iterdir() if (p / "active").is_symlink())

    def _slot(self, name: str, slot: str) -> SlotInfo | None:
        path = self.models / name / slot
        try:
            meta = json.loads((path / "meta.json").read_text())
            return SlotInfo(
                name=meta["name"],
                version=int(meta["version"]),
                slot=slot,
                path=path,
                sha256=meta["sha256"],
                length=int(meta["length"]),
                installed_at=float(meta["installed_at"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None  # empty, or written only in part: not a slot to use

    def active_slot_name(self, name: str) -> str | None:
        link = self.models / name / "active"
        try:
            target = os.readlink(link)
        except OSError:
            return None
        return target if target in SLOTS else None

    def active(self, name: str) -> SlotInfo | None:
        slot = self.active_slot_name(name)
        return self._slot(name, slot) if slot else None

    def previous(self, name: str) -> SlotInfo | None:
        """The version in the inactive slot (what a rollback would go back to)."""
        active = self.active_slot_name(name)
        other = "b" if active == "a" else "a"
        return self._slot(name, other) if active else None

    def package(
        self, name: str, group: str, group_key: bytes, slot: SlotInfo | None = None
    ) -> ModelPackage:
        """The active (or given) slot's package, decrypted into memory.

        Raises:
            ModelNotFoundError: nothing is installed for ``name``.
            IntegrityError, NoKeyError: the slot cannot be decrypted.
            PackageError: the decrypted package is not a valid package.
        """
        info = slot or self.active(name)
        if info is None:
            raise ModelNotFoundError(f"no installed version of {name!r}")
        wrapped = json.loads((info.path / "key.json").read_text())
        key = unwrap_key(wrapped, group_key, name=info.name, version=info.version, group=group)
        plaintext = decrypt_blob(info.path / "payload", key, name=info.name, version=info.version)
        files = _untar(plaintext, info.path)
        package = package_from_files(files, info.path)
        if (package.name, package.version) != (info.name, info.version):
            raise PackageError(
                f"{info.path}: the decrypted package is {package.qualified_name}, "
                f"expected {info.name}:{info.version}"
            )
        return package

    # -- writing ----------------------------------------------------------------------------

    def prepare(self, name: str) -> Path:
        """Empty the inactive slot and return it."""
        folder = self.models / name
        folder.mkdir(parents=True, exist_ok=True)
        active = self.active_slot_name(name)
        slot = folder / ("b" if active == "a" else "a")
        if slot.exists():
            shutil.rmtree(slot)
        slot.mkdir()
        fsync_dir(folder)
        return slot

    def write(
        self,
        slot: Path,
        *,
        name: str,
        version: int,
        payload: Path,
        wrapped_key: dict[str, Any],
        sha256: str,
        on_step: Callable[[str], None] = lambda step: None,
    ) -> SlotInfo:
        """Move a verified payload and its key into ``slot``, flush to disk, ``meta.json`` last.

        ``on_step`` is called between the steps (each one a point where the
        device may lose power; the tests kill the installer there).
        """
        os.replace(payload, slot / "payload")
        on_step("slot:payload-moved")
        _fsync_file(slot / "payload")
        on_step("slot:payload-synced")
        _write_synced(slot / "key.json", json.dumps(wrapped_key).encode())
        on_step("slot:key-written")
        info = SlotInfo(
            name, version, slot.name, slot, sha256, (slot / "payload").stat().st_size, time.time()
        )
        meta = {k: v for k, v in info.to_dict().items() if k != "slot"}
        _write_synced(slot / "meta.json.tmp", json.dumps(meta).encode())
        on_step("slot:meta-written")
        os.replace(slot / "meta.json.tmp", slot / "meta.json")
        on_step("slot:meta-renamed")
        fsync_dir(slot)
        fsync_dir(slot.parent)
        return info

    def activate(
        self, name: str, slot: str, *, on_step: Callable[[str], None] = lambda step: None
    ) -> None:
        """Point ``active`` at ``slot``: one atomic rename."""
        folder = self.models / name
        if self._slot(name, slot) is None:
            raise IntegrityError(f"slot {slot} of {name} holds no complete version")
        tmp = folder / "active.new"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        os.symlink(slot, tmp)
        on_step("activate:link-made")
        os.replace(tmp, folder / "active")
        on_step("activate:renamed")
        fsync_dir(folder)

    def rollback(self, name: str) -> SlotInfo:
        """Go back to the version in the other slot.

        Raises:
            ModelNotFoundError: there is no previous version to go back to.
        """
        previous = self.previous(name)
        if previous is None:
            raise ModelNotFoundError(f"{name!r} has no previous version to roll back to")
        self.activate(name, previous.slot)
        return previous

    def discard(self, slot: Path) -> None:
        """Remove a slot that failed (never the active one)."""
        if slot.exists() and slot.name != self.active_slot_name(slot.parent.name):
            shutil.rmtree(slot)


def _untar(data: bytes, where: Path) -> dict[str, bytes]:
    """The regular files of a tar archive, in memory (names only, no paths)."""
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            for member in archive:
                if len(files) >= MAX_MEMBERS:
                    raise PackageError(f"{where}: too many files in the package")
                if not member.isfile() or "/" in member.name or member.name.startswith("."):
                    raise PackageError(f"{where}: unexpected archive member {member.name!r}")
                handle = archive.extractfile(member)
                assert handle is not None
                files[member.name] = handle.read()
    except tarfile.TarError as exc:
        raise PackageError(
            f"{where}: the decrypted payload is not a package archive: {exc}"
        ) from exc
    return files
