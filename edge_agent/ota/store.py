"""Installed models, in two slots per model, switched atomically.

(Over 400 lines: the slots, the switch and the reading of a slot into memory share one
layout on disk and one set of crash rules; they stay together.)

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

Emptying a slot starts with one atomic ``rename`` of the slot out of the way
(into ``<state>/ota/trash``), flushed, before its files are removed: a power
cut while removing them leaves no slot whose ``meta.json`` claims a version
that is no longer all there. A slot is trusted only when it is complete: its
``meta.json`` parses, its payload has the length ``meta.json`` records and its
key file is there.

One update at a time, across processes: :meth:`OtaStore.locked` holds an
``flock`` on ``<state>/ota/lock`` (the agent's background updater and
``edge-agent update`` may run at once).

Models stay encrypted at rest: :meth:`OtaStore.package` unwraps the data key
with the group's private key and decrypts the blob into memory, where both
runtimes load models from bytes. No plaintext model touches the disk.
"""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import shutil
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator, Set
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from edge_core.errors import IntegrityError, ModelNotFoundError, PackageError, UpdateError
from edge_core.manifest import package_from_files
from edge_core.names import MODEL_NAME_RULE, is_model_name
from edge_core.ota.crypto import BlobHeader, PlaintextReader, iter_plaintext, unwrap_key
from edge_core.package import ModelPackage

__all__ = ["OtaStore", "SlotInfo", "fsync_dir", "open_package"]

CHUNK_READ = 1 << 16  # the tar reader's buffer

log = logging.getLogger(__name__)

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
        self.trash = self.root / "trash"
        for folder in (self.models, self.downloads, self.metadata, self.trash):
            folder.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold ``<state>/ota/lock`` (an ``flock``, released by the kernel if the process dies).

        Blocks while another process (or thread) holds it.
        """
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("another update holds %s; waiting for it", self.root / "lock")
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the only descriptor releases the lock

    def _folder(self, name: str) -> Path:
        if not is_model_name(name):
            raise UpdateError(f"{name!r} is not a model name: expected {MODEL_NAME_RULE}")
        return self.models / name

    # -- reading ----------------------------------------------------------------------------

    def names(self) -> list[str]:
        return sorted(
            p.name
            for p in self.models.iterdir()
            if is_model_name(p.name) and (p / "active").is_symlink()
        )

    def _slot(self, name: str, slot: str) -> SlotInfo | None:
        """The slot's version, if the slot is complete (else ``None``: not one to use)."""
        if not is_model_name(name) or slot not in SLOTS:
            return None
        path = self.models / name / slot
        try:
            meta = json.loads((path / "meta.json").read_text())
            info = SlotInfo(
                name=meta["name"],
                version=int(meta["version"]),
                slot=slot,
                path=path,
                sha256=meta["sha256"],
                length=int(meta["length"]),
                installed_at=float(meta["installed_at"]),
            )
            complete = (
                info.name == name
                and (path / "payload").stat().st_size == info.length
                and (path / "key.json").is_file()
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None  # empty, or written only in part
        return info if complete else None

    def active_slot_name(self, name: str) -> str | None:
        if not is_model_name(name):
            return None
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
        """The complete version in the inactive slot (what a rollback would go back to)."""
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
        return open_package(info.path / "payload", key, name=info.name, version=info.version)

    # -- writing ----------------------------------------------------------------------------

    def _remove(self, path: Path, on_step: Callable[[str], None] = lambda step: None) -> None:
        """Remove a slot: first one atomic, flushed rename out of ``models``, then its files."""
        grave = self.trash / f"{path.parent.name}.{path.name}.{uuid.uuid4().hex}"
        os.replace(path, grave)
        on_step("prepare:moved-to-trash")
        fsync_dir(path.parent)
        fsync_dir(self.trash)
        on_step("prepare:trash-synced")
        shutil.rmtree(grave)
        on_step("prepare:old-removed")

    def _empty_trash(self) -> None:
        for leftover in self.trash.iterdir():  # slots a power cut left half removed
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover)
            else:
                leftover.unlink()

    def prepare(self, name: str, *, on_step: Callable[[str], None] = lambda step: None) -> Path:
        """Empty the inactive slot and return it (hold :meth:`locked`).

        ``on_step`` is called between the steps, as in :meth:`write`.
        """
        folder = self._folder(name)
        folder.mkdir(parents=True, exist_ok=True)
        self._empty_trash()
        on_step("prepare:trash-emptied")
        active = self.active_slot_name(name)
        slot = folder / ("b" if active == "a" else "a")
        if slot.exists():
            self._remove(slot, on_step)
        slot.mkdir()
        on_step("prepare:slot-made")
        fsync_dir(folder)
        return slot

    def clean_downloads(self, keep: Set[str]) -> list[str]:
        """Remove partial downloads (``<sha256>.part``) whose hash is not in ``keep``.

        A partial download of a target the signed metadata still offers is
        kept (the next attempt resumes it); any other is dead weight on a
        small disk. Returns the names removed.
        """
        removed = []
        for part in self.downloads.glob("*.part"):
            if part.name.removesuffix(".part") not in keep:
                part.unlink(missing_ok=True)
                removed.append(part.name)
        return removed

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
        self._folder(name)
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
        """Point ``active`` at ``slot``: one atomic rename.

        Raises:
            IntegrityError: the slot does not hold a complete version.
        """
        folder = self._folder(name)
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
        """Go back to the complete version in the other slot (hold :meth:`locked`).

        Raises:
            ModelNotFoundError: there is no complete previous version to go back to.
        """
        previous = self.previous(name)
        if previous is None:
            raise ModelNotFoundError(f"{name!r} has no previous version to roll back to")
        self.activate(name, previous.slot)
        return previous

    def deactivate(self, name: str) -> None:
        """Serve no installed version of ``name``: the bundled model serves again (hold
        :meth:`locked`). One atomic unlink of ``active``; the slots stay as they are, and
        the next install takes one of them."""
        folder = self._folder(name)
        link = folder / "active"
        if link.is_symlink():
            link.unlink()
            fsync_dir(folder)

    def discard(self, slot: Path) -> None:
        """Remove a slot that failed (never the active one)."""
        if slot.exists() and slot.name != self.active_slot_name(slot.parent.name):
            self._remove(slot)


def open_package(
    payload: Path,
    key: bytes,
    *,
    name: str,
    version: int,
    plaintext_length: int | None = None,
) -> ModelPackage:
    """A blob's package, decrypted and unpacked into memory (every tag is checked).

    ``plaintext_length``: the length the signed metadata gives the plaintext;
    the blob's header must say the same. Nothing past the header's length is
    read (the header is bound into every chunk's tag), and no archive member
    may claim more than is left of it (:func:`_untar`): memory never holds
    more than the signed plaintext.

    Raises:
        IntegrityError: a tag fails, the blob is not a blob, or its plaintext
            length is not the signed one.
        PackageError: the plaintext is not a package of ``name`` ``version``,
            or holds anything but regular files (a sparse one included).
    """
    with payload.open("rb") as blob:
        header = BlobHeader.read_from(blob)
        if plaintext_length is not None and header.length != plaintext_length:
            raise IntegrityError(
                f"{name} v{version}: the blob holds {header.length} bytes of plaintext, but "
                f"its signed metadata says {plaintext_length}; refused"
            )
        blob.seek(0)
        plaintext = PlaintextReader(iter_plaintext(blob, key, name=name, version=version))
        files = _untar(io.BufferedReader(plaintext, CHUNK_READ), payload.parent, header.length)
        plaintext.drain()  # the tar's end padding, and the last tags
    package = package_from_files(files, payload.parent)
    if (package.name, package.version) != (name, version):
        raise PackageError(
            f"{payload}: the decrypted package is {package.qualified_name}, "
            f"expected {name}:{version}"
        )
    return package


REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)


def _untar(stream: IO[bytes], where: Path, length: int) -> dict[str, bytes]:
    """The regular files of a tar archive of ``length`` bytes read as a stream, in memory
    (names only, no paths): each file's bytes are the only copy of the plaintext held.

    Only plain regular files: a GNU or PAX sparse member stores next to nothing and
    reads back as its full size in zeros (a few bytes of archive, gigabytes of
    memory), so it is refused like links and devices; and a member whose size runs
    past the end of the archive is refused before it is read.
    """
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            for member in archive:
                if len(files) >= MAX_MEMBERS:
                    raise PackageError(f"{where}: too many files in the package")
                if member.issparse() or member.type not in REGULAR:
                    kind = "a sparse file" if member.issparse() else f"of type {member.type!r}"
                    raise PackageError(
                        f"{where}: archive member {member.name!r} is {kind}, not a regular "
                        "file; refused"
                    )
                if "/" in member.name or member.name.startswith("."):
                    raise PackageError(f"{where}: unexpected archive member {member.name!r}")
                if member.offset_data + member.size > length:
                    raise PackageError(
                        f"{where}: archive member {member.name!r} claims {member.size} bytes, "
                        f"past the {length} bytes of the signed plaintext; refused"
                    )
                handle = archive.extractfile(member)
                assert handle is not None
                files[member.name] = handle.read()
    except tarfile.TarError as exc:
        raise PackageError(
            f"{where}: the decrypted payload is not a package archive: {exc}"
        ) from exc
    return files
