"""Image files' headers: the format and the size of a picture, read before it is decoded.

A decoder allocates what a file's header says, and a header costs nothing to forge: a
PNG of 16000 x 16000 black pixels is 770 KB, and decoded it is 768 MB, more again as
the float tensor of a model's input. So a file is never handed to a decoder before
:func:`probe` has read its header and :func:`check_pixels` has held it to a limit
(:data:`MAX_IMAGE_PIXELS` unless configured). :func:`probe` reads only the bytes it
needs and allocates nothing in proportion to what the header claims; it knows the
formats the agent accepts (JPEG, PNG, WebP, BMP, GIF, TIFF) and says ``None`` for
anything else, which is then not decoded at all.

A file of several frames or pages (an animated GIF or WebP, a multi-page TIFF) has each
frame counted: ``frames`` is how many (at most :data:`MAX_FRAMES` are walked; more are
counted as that many), ``pixels`` the largest frame's.

Pure: no I/O, no third-party code.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from edge_core.errors import InputError

__all__ = [
    "MAX_FRAMES",
    "MAX_IMAGE_PIXELS",
    "MAX_VIDEO_FRAMES",
    "ImageHeader",
    "check_pixels",
    "check_video",
    "image_format",
    "probe",
]

MAX_IMAGE_PIXELS = 40_000_000  # 40 MP: every phone and camera sensor sold, with room
MAX_FRAMES = 1024  # frames or pages walked in one file
MAX_VIDEO_FRAMES = 216_000  # frames of one video: two hours at 30 a second

# BMP's DIB header sizes (core, info, v2-v5): "BM" alone is too common in text.
_BMP_HEADERS = {12, 40, 52, 56, 64, 108, 124}


@dataclass(frozen=True)
class ImageHeader:
    """What an image file's header says: its format, its first frame's width and
    height, how many frames or pages it holds, and the largest one's pixel count."""

    format: str
    width: int
    height: int
    frames: int = 1
    largest: int = 0  # pixels of the largest frame (0: the first one's)

    @property
    def pixels(self) -> int:
        return max(self.width * self.height, self.largest)


def image_format(data: bytes) -> str | None:
    """The image format ``data`` starts with, or ``None``."""
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "webp"
    if data.startswith((b"II*\x00", b"MM\x00*")):
        return "tiff"
    if (
        data.startswith(b"BM")
        and len(data) >= 18
        and data[6:10] == b"\x00\x00\x00\x00"
        and int.from_bytes(data[14:18], "little") in _BMP_HEADERS
    ):
        return "bmp"
    return None


def probe(data: bytes) -> ImageHeader | None:
    """The header of the image file ``data``; ``None`` when it is not one of the formats
    here or its header cannot be read (cut short, inconsistent): such bytes must not
    be decoded."""
    fmt = image_format(data)
    reader = _READERS.get(fmt) if fmt is not None else None
    if reader is None:
        return None
    try:
        header = reader(memoryview(data))
    except (struct.error, IndexError, ValueError):
        return None
    if header is None or header.width < 1 or header.height < 1:
        return None
    return header


def check_pixels(header: ImageHeader, limit: int, what: str = "the picture") -> None:
    """Refuse a picture larger than ``limit`` pixels (its largest frame), before it is
    decoded.

    Raises:
        InputError: over the limit; the message gives the size and the limit.
    """
    if header.pixels > limit:
        raise InputError(
            f"{what} is {header.width}x{header.height} ({header.pixels:,} pixels), more than "
            f"the limit of {limit:,} pixels (max_image_pixels)"
        )


def check_video(
    width: int, height: int, frames: int, max_pixels: int, max_frames: int, what: str
) -> None:
    """Refuse a video by what its container says: frames of more than ``max_pixels``, or
    more than ``max_frames`` of them (0 for either: not said; a reader counts as it goes).

    Raises:
        InputError: over a limit; the message gives the size and the limit.
    """
    check_pixels(
        ImageHeader("video", max(width, 1), max(height, 1)), max_pixels, f"a frame of {what}"
    )
    if frames > max_frames:
        raise InputError(
            f"{what} has {frames:,} frames, more than the limit of {max_frames:,} "
            "(max_video_frames)"
        )


# -- one reader a format -----------------------------------------------------------------


def _png(data: memoryview) -> ImageHeader | None:
    # the signature, then IHDR: always the first chunk
    if bytes(data[12:16]) != b"IHDR":
        return None
    width, height = struct.unpack_from(">II", data, 16)
    return ImageHeader("png", width, height, _apng_frames(data))


def _apng_frames(data: memoryview) -> int:
    """An animated PNG's frame count (its ``acTL`` chunk, before the first ``IDAT``; each
    frame lies inside the canvas); 1 for a still one."""
    index = 8
    while index + 8 <= len(data):
        (length,) = struct.unpack_from(">I", data, index)
        kind = bytes(data[index + 4 : index + 8])
        if kind == b"acTL":
            frames = int.from_bytes(data[index + 8 : index + 12], "big")
            return max(1, min(frames, MAX_FRAMES))
        if kind == b"IDAT":
            break
        index += 12 + length
    return 1


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg(data: memoryview) -> ImageHeader | None:
    """The first start-of-frame marker's size; markers are walked by their lengths."""
    index = 2
    while index + 4 <= len(data):
        if data[index] != 0xFF:
            return None
        marker = data[index + 1]
        if marker == 0xFF:  # fill byte
            index += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            index += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, start of scan before any frame
            return None
        (length,) = struct.unpack_from(">H", data, index + 2)
        if marker in _SOF:
            height, width = struct.unpack_from(">HH", data, index + 5)
            return ImageHeader("jpeg", width, height)
        if length < 2:
            return None
        index += 2 + length
    return None


def _bmp(data: memoryview) -> ImageHeader:
    size = int.from_bytes(data[14:18], "little")
    if size == 12:  # the OS/2 core header: unsigned 16-bit sides
        width, height = struct.unpack_from("<HH", data, 18)
    else:
        width, height = struct.unpack_from("<ii", data, 18)
    return ImageHeader("bmp", abs(width), abs(height))  # negative height: top-down rows


def _gif(data: memoryview) -> ImageHeader | None:
    """The logical screen, and each frame's image descriptor (walked over its blocks)."""
    width, height, flags = struct.unpack_from("<HHB", data, 6)
    index = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    frames, largest = 0, 0
    while index < len(data) and frames < MAX_FRAMES:
        block = data[index]
        if block == 0x3B:  # trailer
            break
        if block == 0x21:  # an extension: its label, then sub-blocks
            index = _gif_sub_blocks(data, index + 2)
        elif block == 0x2C:  # an image descriptor
            left, top, w, h, frame_flags = struct.unpack_from("<HHHHB", data, index + 1)
            largest = max(largest, (left + w) * (top + h))
            frames += 1
            index += 10
            if frame_flags & 0x80:
                index += 3 << ((frame_flags & 7) + 1)
            index = _gif_sub_blocks(data, index + 1)  # after the LZW minimum code size
        else:
            return None
    if frames == 0:
        return None
    return ImageHeader("gif", width, height, frames, largest)


def _gif_sub_blocks(data: memoryview, index: int) -> int:
    while True:
        size = data[index]  # IndexError past the end: a header cut short
        index += 1 + size
        if size == 0:
            return index


def _webp(data: memoryview) -> ImageHeader | None:
    chunk = bytes(data[12:16])
    if chunk == b"VP8X":  # the extended format's canvas: every frame is inside it
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        frames = _webp_frames(data) if data[20] & 0x02 else 1  # animated: ANMF chunks
        return ImageHeader("webp", width, height, frames)
    if chunk == b"VP8 ":  # lossy: the key frame's start code, then 14-bit sides
        if bytes(data[23:26]) != b"\x9d\x01\x2a":
            return None
        width, height = struct.unpack_from("<HH", data, 26)
        return ImageHeader("webp", width & 0x3FFF, height & 0x3FFF)
    if chunk == b"VP8L":  # lossless: a signature byte, then 14-bit sides less one
        if data[20] != 0x2F:
            return None
        (bits,) = struct.unpack_from("<I", data, 21)
        return ImageHeader("webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    return None


def _webp_frames(data: memoryview) -> int:
    """The ANMF chunks (one a frame) of an animated WebP, walked by their lengths."""
    index, frames = 12, 0
    while index + 8 <= len(data) and frames < MAX_FRAMES:
        (size,) = struct.unpack_from("<I", data, index + 4)
        frames += bytes(data[index : index + 4]) == b"ANMF"
        index += 8 + size + (size & 1)
    return max(frames, 1)


def _tiff(data: memoryview) -> ImageHeader | None:
    """Every page's ImageWidth and ImageLength (IFDs walked, at most :data:`MAX_FRAMES`)."""
    order = "<" if bytes(data[:2]) == b"II" else ">"
    (offset,) = struct.unpack_from(order + "I", data, 4)
    pages: list[tuple[int, int]] = []
    seen: set[int] = set()
    while offset and offset not in seen and len(pages) < MAX_FRAMES:
        seen.add(offset)
        (count,) = struct.unpack_from(order + "H", data, offset)
        sides = {}
        for entry in range(count):
            tag, kind, _, value = struct.unpack_from(order + "HHI4s", data, offset + 2 + 12 * entry)
            if tag in (256, 257):  # ImageWidth, ImageLength: SHORT or LONG
                fmt = order + ("H" if kind == 3 else "I")
                sides[tag] = struct.unpack_from(fmt, value)[0]
        if 256 not in sides or 257 not in sides:
            return None
        pages.append((sides[256], sides[257]))
        (offset,) = struct.unpack_from(order + "I", data, offset + 2 + 12 * count)
    if not pages:
        return None
    (width, height), largest = pages[0], max(w * h for w, h in pages)
    return ImageHeader("tiff", width, height, len(pages), largest)


_READERS = {"png": _png, "jpeg": _jpeg, "bmp": _bmp, "gif": _gif, "webp": _webp, "tiff": _tiff}
