"""Encoded images in byte tensors: recognised, decoded, re-encoded from pixels.

A request can carry a picture as its file's bytes (JPEG, PNG, WebP, BMP, GIF,
TIFF): a ``BYTES`` element, or a flat ``uint8`` tensor. Such bytes are
recognised by their signature (:func:`~edge_core.images.image_format`), their
header read, and decoded (:func:`decode`, through :mod:`edge_core.imaging`; an
animated or multi-page image, or one that is corrupt or cut short, gives ``None``: it
cannot be searched; one over the pixel limit is refused), and written again from pixels
only (:func:`encode`), which drops whatever metadata the file carried (EXIF with its
GPS position and camera serial, XMP, IPTC, comments). :func:`carries_metadata`
tells whether a file may still hold such metadata.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

import numpy as np

from edge_core import imaging
from edge_core.errors import InputError
from edge_core.images import MAX_IMAGE_PIXELS, check_pixels, image_format, probe

__all__ = ["carries_metadata", "decode", "encode", "unwrap_base64"]

Array = np.ndarray[Any, Any]

# How the formats above begin once in base64 (JSON clients send pictures so): those
# long enough to say "a picture" alone, then those that need the decoded bytes to agree.
_BASE64_SURE = (b"/9j/", b"iVBORw0KGgo", b"R0lGOD", b"UklGR")
_BASE64_MAYBE = (b"SUkqA", b"TU0AK", b"Qk")
_URL_SAFE = bytes.maketrans(b"-_", b"+/")
_DATA_URL = re.compile(rb"data:image/[\w.+-]+;base64,", re.IGNORECASE)


def unwrap_base64(text: bytes) -> tuple[bytes, bytes] | None:
    """``(prefix, file bytes)`` of a picture sent as base64 text (standard or URL-safe,
    padded or not), a ``data:image/...`` URL or bare; ``None`` when ``text`` is not one.
    Text that says it is a picture (a data URL, or a bare start that only pictures
    have) but does not decode to one gives empty file bytes: a picture that cannot be
    read, which the exit guard refuses."""
    stripped = text.strip()
    match = _DATA_URL.match(stripped)
    prefix = match.group(0) if match else b""
    body = b"".join(stripped[len(prefix) :].split()).translate(_URL_SAFE)
    sure = bool(prefix) or body.startswith(_BASE64_SURE)
    if not sure and not body.startswith(_BASE64_MAYBE):
        return None
    try:
        data = base64.b64decode(body + b"=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError):
        data = b""
    if image_format(data) is not None:
        return prefix, data
    return (prefix, b"") if sure else None


def decode(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> Array | None:
    """The RGB ``uint8`` picture in ``data``; ``None`` when it cannot be read as one
    picture (corrupt, cut short, several frames or pages). The header is read first:
    several frames are never decoded, nor a picture over the limit.

    Raises:
        InputError: a picture of more than ``max_pixels``.
    """
    header = probe(data)
    if header is None or header.frames != 1:
        return None
    check_pixels(header, max_pixels)
    try:
        return imaging.decode(data, header)
    except InputError:
        return None


def encode(rgb: Array, fmt: str) -> bytes:
    """``rgb`` written as a file of format ``fmt`` (PNG for GIF and TIFF), pixels only."""
    return imaging.encode(rgb, fmt)


def carries_metadata(data: bytes) -> bool:
    """Whether an image file may hold metadata beyond its pixels: EXIF, XMP, IPTC or
    comments in JPEG, PNG and WebP; always for GIF and TIFF (not looked into)."""
    fmt = image_format(data)
    if fmt == "jpeg":
        return _jpeg_metadata(data)
    if fmt == "png":
        return _chunks_metadata(data, 8, b"eXIf", b"tEXt", b"zTXt", b"iTXt")
    if fmt == "webp":
        return _chunks_metadata(data, 12, b"EXIF", b"XMP ")
    return fmt in ("gif", "tiff")


def _jpeg_metadata(data: bytes) -> bool:
    """APP1 (EXIF, XMP), APP13 (IPTC) or COM segments before the image data."""
    index = 2
    while index + 4 <= len(data):
        if data[index] != 0xFF:
            return True  # not a marker where one must be: cannot tell, assume the worst
        marker = data[index + 1]
        if marker == 0xFF:  # fill byte
            index += 1
            continue
        if marker in (0xDA, 0xD9):  # start of scan, end of image: no more headers
            return False
        if marker in (0xE1, 0xED, 0xFE):
            return True
        index += 2 + int.from_bytes(data[index + 2 : index + 4], "big")
    return False


def _chunks_metadata(data: bytes, start: int, *kinds: bytes) -> bool:
    """Whether PNG chunks (length big-endian, then type; CRC after the data) or RIFF
    chunks (type, then length little-endian; data padded to even) of ``kinds`` appear."""
    png = start == 8
    index = start
    while index + 8 <= len(data):
        first, second = data[index : index + 4], data[index + 4 : index + 8]
        if png:
            kind, length, overhead = second, int.from_bytes(first, "big"), 12
        else:
            kind, length = first, int.from_bytes(second, "little")
            overhead = 8 + (length & 1)
        if kind in kinds:
            return True
        index += length + overhead
    return False
