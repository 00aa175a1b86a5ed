"""The encrypted model blob and the data-key wrapping, shared by publisher and devices.

A model travels as one *blob*: AES-256-GCM over fixed-size chunks, with a
fresh data key per published version::

    header  = b"EIMB\\x01" | chunk size (u32) | nonce prefix (8 bytes) | plaintext length (u64)
    chunk i = ciphertext (chunk size, the last one shorter) | GCM tag (16 bytes)

Each chunk's nonce is the prefix and its index; its associated data binds the
model name, the version, the whole header, the chunk index and whether it is
the last chunk. So chunks cannot be reordered, dropped, repeated, truncated or
extended without a tag failing, and a blob of one model or version cannot pass
for another. Verification and decryption stream one chunk at a time: memory
does not grow with the model.

The data key is wrapped for each device group with the group's X25519 public
key: an ephemeral key agreement, HKDF-SHA256 (its info binds model, version
and group) and AES-256-GCM. Only holders of the group's private key (from
their enrollment bundle) can unwrap it.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from edge_core.errors import IntegrityError, NoKeyError

__all__ = [
    "CHUNK_SIZE",
    "BlobHeader",
    "PlaintextReader",
    "decrypt_blob",
    "encrypt_file",
    "generate_group_key",
    "iter_plaintext",
    "public_key_of",
    "unwrap_key",
    "verify_blob",
    "wrap_key",
]

MAGIC = b"EIMB\x01"
HEADER = struct.Struct(">5sI8sQ")
TAG = 16
CHUNK_SIZE = 1 << 20
WRAP_ALGORITHM = "X25519-HKDF-SHA256-AES256GCM"


class Reads(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class Readable(Reads, Protocol):
    def readinto(self, buffer: Any, /) -> int | None: ...


@dataclass(frozen=True)
class BlobHeader:
    chunk_size: int
    nonce_prefix: bytes
    length: int  # of the plaintext

    @property
    def raw(self) -> bytes:
        return HEADER.pack(MAGIC, self.chunk_size, self.nonce_prefix, self.length)

    @property
    def chunks(self) -> int:
        return max(1, -(-self.length // self.chunk_size))

    @property
    def blob_length(self) -> int:
        return HEADER.size + self.length + TAG * self.chunks

    @classmethod
    def read_from(cls, reader: Reads) -> BlobHeader:
        """The header at the start of a blob being read.

        Raises:
            IntegrityError: it is not a blob's header.
        """
        return cls.parse(reader.read(HEADER.size))

    @classmethod
    def parse(cls, raw: bytes) -> BlobHeader:
        if len(raw) != HEADER.size:
            raise IntegrityError("the blob is shorter than its header")
        magic, chunk_size, prefix, length = HEADER.unpack(raw)
        if magic != MAGIC or not 1024 <= chunk_size <= 64 << 20:
            raise IntegrityError("not an encrypted model blob (bad magic or chunk size)")
        return cls(chunk_size, prefix, length)


def _aad(name: str, version: int, header: BlobHeader, index: int, final: bool) -> bytes:
    return b"".join(
        [
            b"edge-inference/model-blob\x00",
            name.encode(),
            b"\x00",
            str(version).encode(),
            b"\x00",
            header.raw,
            struct.pack(">QB", index, final),
        ]
    )


def _nonce(header: BlobHeader, index: int) -> bytes:
    return header.nonce_prefix + struct.pack(">I", index)


def encrypt_file(
    source: Path,
    target: Path,
    key: bytes,
    *,
    name: str,
    version: int,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[int, str]:
    """Encrypt ``source`` into ``target`` chunk by chunk; returns the blob's length and SHA-256."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    aead = AESGCM(key)
    length = source.stat().st_size
    header = BlobHeader(chunk_size, os.urandom(8), length)
    digest = hashlib.sha256()
    with source.open("rb") as reader, target.open("wb") as writer:
        writer.write(header.raw)
        digest.update(header.raw)
        for index in range(header.chunks):
            plain = reader.read(chunk_size)
            final = index == header.chunks - 1
            sealed = aead.encrypt(
                _nonce(header, index), plain, _aad(name, version, header, index, final)
            )
            writer.write(sealed)
            digest.update(sealed)
        if reader.read(1):
            raise IntegrityError(f"{source} grew while it was being encrypted")
        writer.flush()
        os.fsync(writer.fileno())
    return header.blob_length, digest.hexdigest()


def iter_plaintext(reader: IO[bytes], key: bytes, *, name: str, version: int) -> Iterator[bytes]:
    """Decrypt a blob chunk by chunk, checking every tag (and that nothing follows the end).

    Raises:
        IntegrityError: a tag fails, the blob is truncated or extended, or
            the header is not a blob's.
    """
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    header = BlobHeader.read_from(reader)
    aead = AESGCM(key)
    remaining = header.length
    for index in range(header.chunks):
        size = min(header.chunk_size, remaining)
        sealed = reader.read(size + TAG)
        if len(sealed) != size + TAG:
            raise IntegrityError(f"the blob is truncated in chunk {index}")
        final = index == header.chunks - 1
        try:
            plain = aead.decrypt(
                _nonce(header, index), sealed, _aad(name, version, header, index, final)
            )
        except InvalidTag:
            raise IntegrityError(
                f"chunk {index} of {name} v{version} fails its authentication tag"
            ) from None
        remaining -= size
        yield plain
    if reader.read(1):
        raise IntegrityError("the blob goes on past its last chunk")


def verify_blob(
    reader: Readable,
    key: bytes,
    *,
    name: str,
    version: int,
    on_chunk: Callable[[int], None] = lambda index: None,
) -> int:
    """Check every chunk's tag of a blob without keeping the plaintext; returns its length.

    The same checks as :func:`iter_plaintext`, into one reused buffer: the
    install path's memory does not grow with the model, and the pass runs at
    the speed of the disk cache rather than of memory allocation.

    Raises:
        IntegrityError: a tag fails, or the blob is truncated, extended or not a blob.
    """
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    header = BlobHeader.read_from(reader)
    sealed = bytearray(header.chunk_size + TAG)
    scratch = bytearray(header.chunk_size + 15)
    remaining = header.length
    for index in range(header.chunks):
        size = min(header.chunk_size, remaining)
        view = memoryview(sealed)[: size + TAG]
        if reader.readinto(view) != size + TAG:
            raise IntegrityError(f"the blob is truncated in chunk {index}")
        final = index == header.chunks - 1
        decryptor = Cipher(
            algorithms.AES(key), modes.GCM(_nonce(header, index), bytes(view[size:]))
        ).decryptor()
        decryptor.authenticate_additional_data(_aad(name, version, header, index, final))
        decryptor.update_into(view[:size], scratch)
        try:
            decryptor.finalize()
        except InvalidTag:
            raise IntegrityError(
                f"chunk {index} of {name} v{version} fails its authentication tag"
            ) from None
        remaining -= size
        on_chunk(index)
    if reader.read(1):
        raise IntegrityError("the blob goes on past its last chunk")
    return header.length


class PlaintextReader(io.RawIOBase):
    """A blob's plaintext as a file to read from, decrypted chunk by chunk as it is read:
    at most one chunk of plaintext is held here. Every tag is checked by the time the
    reader has been read to its end (:meth:`drain`)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._chunk = b""
        self._offset = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._offset >= len(self._chunk):
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._chunk, self._offset = chunk, 0
        size = min(len(buffer), len(self._chunk) - self._offset)
        buffer[:size] = self._chunk[self._offset : self._offset + size]
        self._offset += size
        return size

    def drain(self) -> None:
        """Decrypt (and check) whatever has not been read."""
        for _ in self._chunks:
            pass


def decrypt_blob(path: Path, key: bytes, *, name: str, version: int) -> bytes:
    """The whole plaintext of a blob file (to hand to a runtime in memory)."""
    with path.open("rb") as reader:
        return b"".join(iter_plaintext(reader, key, name=name, version=version))


# -- group keys and wrapping -------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: Any, what: str) -> bytes:
    try:
        return base64.b64decode(str(text), validate=True)
    except (ValueError, TypeError):
        raise IntegrityError(f"the wrapped key's {what} is not base64") from None


def generate_group_key() -> tuple[bytes, bytes]:
    """A new X25519 key pair: (private, public), 32 raw bytes each."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        PublicFormat,
    )

    private = X25519PrivateKey.generate()
    return (
        private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()),
        private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw),
    )


def public_key_of(private: bytes) -> bytes:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    key = X25519PrivateKey.from_private_bytes(private)
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _kek(shared: bytes, ephemeral: bytes, recipient: bytes, info: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=ephemeral + recipient, info=info).derive(
        shared
    )


def _info(name: str, version: int, group: str) -> bytes:
    return f"edge-inference/key-wrap/v1\x00{name}\x00{version}\x00{group}".encode()


def wrap_key(
    data_key: bytes, group_public: bytes, *, name: str, version: int, group: str
) -> dict[str, str]:
    """The data key wrapped for one group (a small JSON-able dict)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    ephemeral = X25519PrivateKey.generate()
    ephemeral_public = ephemeral.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    shared = ephemeral.exchange(X25519PublicKey.from_public_bytes(group_public))
    info = _info(name, version, group)
    nonce = os.urandom(12)
    sealed = AESGCM(_kek(shared, ephemeral_public, group_public, info)).encrypt(
        nonce, data_key, info
    )
    return {
        "algorithm": WRAP_ALGORITHM,
        "group": group,
        "model": name,
        "version": str(version),
        "ephemeral_public": _b64(ephemeral_public),
        "nonce": _b64(nonce),
        "wrapped": _b64(sealed),
    }


def unwrap_key(
    wrapped: dict[str, Any], group_private: bytes, *, name: str, version: int, group: str
) -> bytes:
    """The data key, unwrapped with the group's private key.

    Raises:
        NoKeyError: the key was wrapped for another group, model or version,
            or this is not the group's key.
    """
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if wrapped.get("algorithm") != WRAP_ALGORITHM:
        raise NoKeyError(f"unknown key wrapping {wrapped.get('algorithm')!r}")
    if (wrapped.get("group"), wrapped.get("model"), wrapped.get("version")) != (
        group,
        name,
        str(version),
    ):
        raise NoKeyError(
            f"the key was wrapped for group {wrapped.get('group')!r}, model "
            f"{wrapped.get('model')!r} v{wrapped.get('version')}, not for {group!r}, "
            f"{name!r} v{version}"
        )
    ephemeral_public = _unb64(wrapped.get("ephemeral_public"), "ephemeral key")
    private = X25519PrivateKey.from_private_bytes(group_private)
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(ephemeral_public))
    except ValueError:
        raise NoKeyError("the wrapped key's ephemeral public key is invalid") from None
    recipient = public_key_of(group_private)
    info = _info(name, version, group)
    try:
        return AESGCM(_kek(shared, ephemeral_public, recipient, info)).decrypt(
            _unb64(wrapped.get("nonce"), "nonce"), _unb64(wrapped.get("wrapped"), "payload"), info
        )
    except InvalidTag:
        raise NoKeyError(
            f"this device's key for group {group!r} cannot unwrap the data key"
        ) from None
