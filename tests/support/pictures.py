"""Pictures made for the tests: a black PNG of any size that is never held decoded,
and scikit-image's astronaut as a JPEG of any size."""

from __future__ import annotations

import struct
import zlib

import cv2
from skimage import data

__all__ = ["astronaut_jpeg", "blank_png"]


def blank_png(width: int, height: int) -> bytes:
    """A black RGB PNG of any size, made a row at a time: a 16000 x 16000 one is 750 KB,
    and 768 MB once decoded."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    compressor = zlib.compressobj(9)
    row = b"\x00" * (1 + 3 * width)
    body = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")
    )


def astronaut_jpeg(height: int, width: int, quality: int = 90) -> bytes:
    """scikit-image's astronaut (a face) stretched to ``height`` x ``width``, as a JPEG."""
    picture = cv2.resize(data.astronaut()[:, :, ::-1], (width, height))
    return bytes(cv2.imencode(".jpg", picture, [cv2.IMWRITE_JPEG_QUALITY, quality])[1].tobytes())
