"""The pictures module (edge_core/imaging.py): each operation against pixels worked out
by hand, then against OpenCV (which did this work before, and still reads videos) on
scikit-image's astronaut, within the tolerances stated here."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import warnings
from typing import Any

import cv2
import numpy as np
import pytest
from PIL import Image
from skimage import data

from edge_agent.privacy.encoded import carries_metadata
from edge_core import imaging
from edge_core.errors import InputError
from edge_core.images import probe
from tests.support.paths import ROOT

ASTRONAUT = data.astronaut()


def read(blob: bytes, reduce_to: tuple[int, int] | None = None) -> np.ndarray:
    header = probe(blob)
    assert header is not None
    return imaging.decode(blob, header, reduce_to)


def pillow_file(image: Image.Image, fmt: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def differences(ours: np.ndarray, theirs: np.ndarray) -> tuple[int, float]:
    gap = np.abs(ours.astype(np.int64) - theirs.astype(np.int64))
    return int(gap.max()), float(gap.mean())


# -- decode ---------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", [".png", ".bmp", ".webp", ".tiff"])
def test_a_lossless_file_opencv_wrote_decodes_to_the_same_pixels(ext: str) -> None:
    ok, blob = cv2.imencode(ext, ASTRONAUT[:, :, ::-1])
    assert ok
    assert np.array_equal(read(blob.tobytes()), ASTRONAUT)


def test_a_jpeg_decodes_as_opencv_decodes_it_and_shrinks_by_its_dct() -> None:
    blob = cv2.imencode(".jpg", ASTRONAUT[:, :, ::-1])[1].tobytes()
    theirs = cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1]
    assert differences(read(blob), theirs)[0] <= 2  # libjpeg's IDCT, the same library
    reduced = read(blob, reduce_to=(100, 120))
    assert reduced.shape == (128, 128, 3)  # 1/4: the largest that stays above 100 x 120
    theirs = cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_REDUCED_COLOR_4)[:, :, ::-1]
    assert differences(reduced, theirs)[0] <= 2


def test_the_exif_orientation_is_applied_as_the_camera_meant() -> None:
    tall = np.zeros((40, 60, 3), np.uint8)
    tall[:10] = 255  # a white band along the top of the stored pixels
    exif = Image.Exif()
    exif[0x0112] = 6  # stored turned: shown rotated 90 degrees clockwise
    blob = pillow_file(Image.fromarray(tall), "PNG", exif=exif)
    shown = read(blob)
    assert shown.shape == (60, 40, 3)
    assert (shown[:, -10:] == 255).all() and (shown[:, :-10] == 0).all()  # on the right
    assert shown.shape == cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_COLOR).shape


def test_sixteen_bit_samples_keep_their_high_byte() -> None:
    wide = np.full((8, 8), 0x12FF, np.uint16)
    ok, blob = cv2.imencode(".png", wide)
    assert ok
    assert (read(blob.tobytes()) == 0x12).all()  # Pillow's own conversion would clip: 255
    theirs = cv2.imdecode(np.frombuffer(blob.tobytes(), np.uint8), cv2.IMREAD_COLOR)
    assert (theirs == 0x12).all()


def test_palettes_with_transparency_decode_without_a_warning() -> None:
    image = Image.new("P", (16, 16), 1)
    image.putpalette([0, 0, 0, 200, 10, 20] + [0] * 762)
    image.info["transparency"] = b"\x00\xff"
    blob = pillow_file(image, "PNG", transparency=b"\x00\xff")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (read(blob) == [200, 10, 20]).all()


@pytest.mark.parametrize("cut", [2, 50])
def test_a_file_cut_short_is_an_input_error(cut: int) -> None:
    blob = cv2.imencode(".jpg", ASTRONAUT)[1].tobytes()
    header = probe(blob)
    assert header is not None
    with pytest.raises(InputError, match="JPEG file corrupt or cut short"):
        imaging.decode(blob[: len(blob) // cut], header)


def test_pillows_bomb_check_never_refuses_below_our_limit() -> None:
    """In a fresh interpreter whose Pillow ceiling is far below the picture (as its
    89 MP default is below a limit an operator may set): no warning, no refusal, for
    the formats whose decoders check on their own too (TIFF's pages, GIF's frames)."""
    script = f"""
import io, json, sys, warnings
sys.path.insert(0, {str(ROOT)!r})
from PIL import Image
Image.MAX_IMAGE_PIXELS = 1000  # a ceiling of 1,000: refuses past 2,000 pixels
warnings.simplefilter("error")
from edge_core import imaging
from edge_core.images import probe
sizes = []
for fmt in ("PNG", "TIFF", "GIF", "JPEG"):
    buffer = io.BytesIO()
    Image.new("RGB", (100, 60), (9, 9, 9)).save(buffer, fmt)
    blob = buffer.getvalue()
    sizes.append(list(imaging.decode(blob, probe(blob)).shape))
print(json.dumps([sizes, Image.MAX_IMAGE_PIXELS]))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    sizes, ceiling = json.loads(done.stdout)
    assert sizes == [[60, 100, 3]] * 4
    assert ceiling == 6000  # raised to the picture that was let in, never lowered


# -- encode ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jpeg", "png", "webp", "bmp", "gif", "tiff"])
def test_a_picture_is_written_with_its_pixels_only(fmt: str) -> None:
    blob = imaging.encode(ASTRONAUT, fmt)
    assert not carries_metadata(blob)
    assert not Image.open(io.BytesIO(blob)).info.get("icc_profile")
    back = read(blob)
    if fmt == "jpeg":
        assert differences(back, ASTRONAUT)[1] < 2  # quality 95
    else:
        assert np.array_equal(back, ASTRONAUT)  # lossless (GIF and TIFF as PNG)
    expected = {"jpeg": "jpeg", "webp": "webp", "bmp": "bmp"}.get(fmt, "png")
    header = probe(blob)
    assert header is not None and header.format == expected


# -- resize, grey ---------------------------------------------------------------------------


def test_area_averages_what_each_pixel_covers_and_nearest_repeats_pixels() -> None:
    pixels = np.arange(16, dtype=np.uint8).reshape(4, 4) * 10
    assert imaging.resize(pixels, (2, 2), "area").tolist() == [[25, 45], [105, 125]]
    row = np.array([[0, 30, 90]], np.uint8)  # 3 -> 2: a pixel and half the next each
    assert imaging.resize(row, (1, 2), "area").tolist() == [[10, 70]]
    small = np.array([[0, 100], [200, 50]], np.uint8)
    big = imaging.resize(small[:, :, None], (4, 6), "nearest")
    assert big.shape == (4, 6, 1)
    assert big[:, :, 0].tolist() == [[0] * 3 + [100] * 3] * 2 + [[200] * 3 + [50] * 3] * 2


def test_linear_enlarging_interpolates_between_pixel_centres() -> None:
    row = np.array([[0, 100]], np.uint8)
    # centres of 4 output pixels over 2 input ones: 0.25 and 0.75 of an input pixel in,
    # clamped at the borders
    assert imaging.resize(row, (1, 4), "linear").tolist() == [[0, 25, 75, 100]]


# Against OpenCV on the astronaut (512 x 512): the largest and the mean difference
# allowed, in 0..255. Area, linear and nearest sample as OpenCV does (a level apart at
# most: its fixed-point arithmetic); cubic is Pillow's kernel (a = -0.5 where OpenCV's
# is -0.75), which also widens as it shrinks.
SAMPLED = (("area", cv2.INTER_AREA), ("linear", cv2.INTER_LINEAR), ("nearest", cv2.INTER_NEAREST))
AGAINST_OPENCV = [
    *(
        (how, size, flag, 1, 0.2)
        for how, flag in SAMPLED
        for size in ((128, 128), (300, 200), (700, 900), (100, 77), (7, 3))
    ),
    ("cubic", (700, 900), cv2.INTER_CUBIC, 20, 1.0),
    ("cubic", (256, 256), cv2.INTER_CUBIC, 80, 3.0),
]


@pytest.mark.parametrize(("interpolation", "size", "flag", "largest", "mean"), AGAINST_OPENCV)
def test_resizing_agrees_with_opencv_within_its_tolerance(
    interpolation: str, size: tuple[int, int], flag: int, largest: int, mean: float
) -> None:
    ours = imaging.resize(ASTRONAUT, size, interpolation)
    theirs = cv2.resize(ASTRONAUT, size[::-1], interpolation=flag)
    assert ours.shape == theirs.shape
    worst, average = differences(ours, theirs)
    assert worst <= largest and average <= mean, (worst, average)


def test_grey_is_the_601_luma_of_either_order() -> None:
    theirs = cv2.cvtColor(ASTRONAUT, cv2.COLOR_RGB2GRAY)
    assert differences(imaging.grey(ASTRONAUT, "rgb"), theirs)[0] <= 1
    assert differences(imaging.grey(ASTRONAUT[:, :, ::-1], "bgr"), theirs)[0] <= 1
    assert imaging.grey(np.array([[[255, 0, 0], [0, 0, 255]]], np.uint8)).tolist() == [[76, 29]]


# -- box blur, 3x3 maximum ------------------------------------------------------------------


def test_a_box_blur_averages_its_window_and_reflects_at_the_border() -> None:
    row = np.array([[0, 0, 90, 0, 0]], np.uint8)
    # a 3-wide window; above and below the one row its reflection is the row itself
    assert imaging.box_blur(row, 3).tolist() == [[0, 30, 30, 30, 0]]


@pytest.mark.parametrize("kernel", [3, 4, 7, 51, 300])
def test_a_box_blur_agrees_with_opencv(kernel: int) -> None:
    region = np.ascontiguousarray(ASTRONAUT[100:300, 150:260])
    worst, _ = differences(imaging.box_blur(region, kernel), cv2.blur(region, (kernel, kernel)))
    assert worst <= (0 if kernel % 2 else 1)  # an even window: OpenCV rounds some halves down


def test_the_3x3_maximum_is_opencvs_dilation() -> None:
    heat = np.random.default_rng(7).random((60, 80)).astype(np.float32)
    assert np.array_equal(imaging.max3x3(heat), cv2.dilate(heat, np.ones((3, 3), np.uint8)))
    one = np.zeros((3, 3), np.float32)
    one[0, 0] = 1.0
    assert imaging.max3x3(one).tolist() == [[1, 1, 0], [1, 1, 0], [0, 0, 0]]
