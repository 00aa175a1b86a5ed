"""Image headers read before decoding (issue 29, item 1): every format the agent takes,
as OpenCV and Pillow write it, a frame count for animations and pages, and nothing but
``None`` for bytes that are not a readable header, whatever they hold."""

from __future__ import annotations

import io
import struct

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from edge_core.errors import InputError
from edge_core.images import ImageHeader, check_pixels, check_video, probe
from tests.support.pictures import blank_png

SIZES = [(1, 1), (7, 9), (480, 640), (1080, 1920), (3000, 4000)]


@pytest.mark.slow
@pytest.mark.parametrize("extension", [".png", ".jpg", ".bmp", ".webp", ".tiff", ".gif"])
@pytest.mark.parametrize(("height", "width"), SIZES)
def test_the_header_gives_the_size_opencv_writes(extension: str, height: int, width: int) -> None:
    rng = np.random.default_rng(height)
    picture = rng.integers(0, 255, (height, width, 3), np.uint8)
    ok, buffer = cv2.imencode(extension, picture)
    assert ok
    header = probe(buffer.tobytes())
    assert header is not None
    assert (header.width, header.height, header.frames) == (width, height, 1)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "BMP", "WEBP", "TIFF", "GIF"])
@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA", "1", "P"])
def test_the_header_gives_the_size_pillow_writes(fmt: str, mode: str) -> None:
    buffer = io.BytesIO()
    picture = Image.new(mode, (321, 123))
    if fmt == "JPEG" and mode in ("RGBA", "P"):  # JPEG holds neither: as Pillow's users do
        picture = picture.convert("RGB")
    picture.save(buffer, fmt)
    header = probe(buffer.getvalue())
    assert header is not None and (header.width, header.height) == (321, 123)


def test_progressive_jpeg_and_lossless_webp() -> None:
    picture = np.zeros((100, 200, 3), np.uint8)
    for extension, params in ((".jpg", [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]),
                              (".webp", [cv2.IMWRITE_WEBP_QUALITY, 101])):  # fmt: skip
        header = probe(cv2.imencode(extension, picture, params)[1].tobytes())
        assert header is not None and (header.width, header.height) == (200, 100)


@pytest.mark.parametrize("fmt", ["GIF", "WEBP", "TIFF", "PNG"])
def test_every_frame_and_page_is_counted(fmt: str) -> None:
    """Animated GIF, WebP and PNG, multi-page TIFF: OpenCV's ``imdecodemulti`` decodes
    each of them, so each counts; a later, larger page sets the size."""
    frames = [Image.new("RGB", (60, 50), (i * 80, 0, 0)) for i in range(3)]
    if fmt == "TIFF":
        frames[2] = Image.new("RGB", (600, 500))
    buffer = io.BytesIO()
    frames[0].save(buffer, fmt, save_all=True, append_images=frames[1:])
    header = probe(buffer.getvalue())
    assert header is not None and header.frames == 3
    assert header.pixels == (600 * 500 if fmt == "TIFF" else 60 * 50)


@pytest.mark.slow
def test_a_huge_picture_is_told_from_its_header() -> None:
    data = blank_png(16000, 16000)
    assert len(data) < 1_000_000
    header = probe(data)
    assert header == ImageHeader("png", 16000, 16000)
    with pytest.raises(
        InputError, match=r"16000x16000 \(256,000,000 pixels\), more than the limit of 40,000,000"
    ):
        check_pixels(header, 40_000_000)
    check_pixels(ImageHeader("png", 8000, 5000), 40_000_000)  # at the limit: taken


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x89PNG\r\n\x1a\n",  # a signature, no IHDR
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDX" + b"\x00" * 13,  # not IHDR
        b"\xff\xd8\xff\xe0\x00\x10JFIF\x00",  # cut before any frame
        b"\xff\xd8\xff\xda\x00\x08" + b"\x00" * 10,  # a scan before any frame
        b"GIF89a\x10\x00\x10\x00\x00\x00\x00;",  # no frame at all
        b"RIFF\x00\x00\x00\x00WEBPVP8 \x00\x00\x00\x00" + b"\x00" * 10,  # no start code
        b"II*\x00\x08\x00\x00\x00\x00\x00",  # a page without sides
        b"II*\x00\x08\x00\x00\x00",  # an IFD past the end
        b"not a picture at all, however long it goes on" * 10,
    ],
)
def test_bytes_that_are_no_readable_header_are_none(data: bytes) -> None:
    assert probe(data) is None


def test_a_tiff_whose_pages_loop_ends() -> None:
    page = struct.pack("<H", 2) + struct.pack("<HHI4s", 256, 3, 1, struct.pack("<H", 10))
    page += struct.pack("<HHI4s", 257, 3, 1, struct.pack("<H", 20)) + struct.pack("<I", 8)
    header = probe(b"II*\x00" + struct.pack("<I", 8) + page)  # the next page is itself
    assert header is not None and header.frames == 1 and (header.width, header.height) == (10, 20)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from([b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF89a", b"II*\x00", b"MM\x00*",
                     b"BM\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x28\x00\x00\x00"]),
    st.binary(max_size=200),
)  # fmt: skip
def test_any_bytes_after_a_signature_give_a_header_or_none(prefix: bytes, rest: bytes) -> None:
    header = probe(prefix + rest)
    assert header is None or (header.width >= 1 and header.height >= 1 and header.frames >= 1)


def test_a_video_is_held_to_its_limits_by_its_container() -> None:
    check_video(1920, 1080, 9000, 40_000_000, 216_000, "cam.mp4")
    check_video(0, 0, 0, 40_000_000, 216_000, "cam.mp4")  # not said: counted as read
    with pytest.raises(InputError, match=r"a frame of big\.mp4 is 8000x6000"):
        check_video(8000, 6000, 10, 40_000_000, 216_000, "big.mp4")
    with pytest.raises(InputError, match=r"long\.mp4 has 300,000 frames, more than the limit"):
        check_video(640, 480, 300_000, 40_000_000, 216_000, "long.mp4")
