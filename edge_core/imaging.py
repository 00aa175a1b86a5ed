"""Pictures as arrays: decoding, encoding, resizing, colours, a box blur and a 3x3 maximum.

Every picture the agent reads or writes passes here: the image files of requests
(:mod:`edge_agent.preprocess`, :mod:`edge_agent.privacy.encoded`), the face detectors'
resizes, redaction. They run on Pillow, imported on first use, and NumPy, so a device
that takes pictures needs Pillow and not OpenCV, several times its size on disk, which
only video and streams need (the agent's ``video`` extra).

- :func:`decode` is handed a file whose header :func:`edge_core.images.probe` read and
  :func:`~edge_core.images.check_pixels` held to the caller's limit: that check is the
  rule, and this module never decides what is too large. Only the decoder of the format
  the header named reads the bytes. Pillow's own decompression-bomb check would warn
  at 89 MP and refuse at twice that, below a limit an operator may set: its ceiling is
  raised to the caller's limit when lower, never lowered, so that it is never what
  refuses (one process, one limit; other Pillow code there keeps a ceiling at least as
  high as the one the agent was told is safe). A JPEG on its way to a much smaller size
  is decoded at 1/2, 1/4 or 1/8 of it (libjpeg's DCT scaling: the whole picture is never
  held); the EXIF orientation is applied, as the camera meant and as OpenCV did.
- :func:`encode` writes pixels only: no EXIF, XMP, ICC or comment of the file they came
  from reaches the output.
- :func:`resize` takes the manifest's interpolations, and samples as OpenCV did (in
  NumPy, a level apart at most): the models and the face detectors were tuned on
  OpenCV's pictures, and Pillow's filters, which widen as they shrink, cost the
  detectors recall. ``cubic`` is Pillow's (its kernel is a little softer).
- :func:`box_blur` and :func:`max3x3` are NumPy too: the same border rules as OpenCV's
  ``blur`` (reflected) and ``dilate`` (outside counts for nothing).

Arrays are ``uint8``, ``H x W x 3`` (RGB unless a caller says BGR) or ``H x W``.
"""

from __future__ import annotations

import io
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_core.errors import InputError
from edge_core.extras import require
from edge_core.images import ImageHeader

if TYPE_CHECKING:
    from PIL import Image as PILImage

__all__ = [
    "INTERPOLATIONS",
    "box_blur",
    "decode",
    "encode",
    "grey",
    "max3x3",
    "resize",
]

Array = np.ndarray[Any, Any]

# the manifest's interpolations (edge_core.manifest checks the names)
INTERPOLATIONS = ("area", "linear", "nearest", "cubic")

# How each format is written: the formats the agent reads whose writers add metadata of
# their own (TIFF's tags) or several frames (GIF) become PNG.
_WRITERS: dict[str, tuple[str, dict[str, Any]]] = {
    "jpeg": ("JPEG", {"quality": 95}),
    "png": ("PNG", {"compress_level": 1}),  # fast, as OpenCV wrote them
    "webp": ("WEBP", {"lossless": True}),  # what came in loses nothing more
    "bmp": ("BMP", {}),
}
_BAND_BYTES = 4 << 20  # a decoded picture is copied out this much at a time
_ceiling = threading.Lock()


def _pil() -> Any:
    """Pillow's ``Image`` module (base dependency: every device takes pictures)."""
    return require("PIL.Image", "Pillow", "", "reading pictures")


def _allow(pixels: int) -> None:
    """Pillow's decompression-bomb ceiling at least ``pixels``: our limit is the rule."""
    image = _pil()
    with _ceiling:
        if image.MAX_IMAGE_PIXELS is not None and pixels > image.MAX_IMAGE_PIXELS:
            image.MAX_IMAGE_PIXELS = pixels


def decode(data: bytes, header: ImageHeader, reduce_to: tuple[int, int] | None = None) -> Array:
    """The RGB ``uint8`` picture of an image file whose ``header`` was read and held to
    the limit; its first frame or page.

    ``reduce_to``: the (height, width) it is on its way to; a JPEG at least twice as
    large each way is decoded at 1/2, 1/4 or 1/8 of its size, never below it.

    Raises:
        InputError: the file is corrupt, cut short, or not what its header says.
    """
    image_module = _pil()
    _allow(header.pixels)
    try:
        with image_module.open(io.BytesIO(data), formats=[header.format.upper()]) as image:
            if reduce_to is not None and header.format == "jpeg":
                image.draft("RGB", (reduce_to[1], reduce_to[0]))
            image.load()
            _orient(image)
            return _rgb_array(image)
    except (OSError, SyntaxError, ValueError, EOFError) as exc:  # Pillow's for bad files
        kind = header.format.upper()
        raise InputError(f"cannot decode the image: a {kind} file corrupt or cut short") from exc


def _orient(image: PILImage.Image) -> None:
    from PIL import ImageOps

    ImageOps.exif_transpose(image, in_place=True)


def _rgb_array(image: PILImage.Image) -> Array:
    """``image`` as ``H x W x 3`` RGB; 16-bit samples keep their high byte, as OpenCV's
    colour decoding did (Pillow's own conversion clips them)."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        wide = np.asarray(image).astype(np.int64)
        narrow = (np.clip(wide, 0, 0xFFFF) >> 8).astype(np.uint8)
        return np.repeat(narrow[:, :, None], 3, axis=2)
    if image.mode != "RGB":
        if image.mode == "P" and "transparency" in image.info:
            image = image.convert("RGBA")  # Pillow's advice for such palettes
        image = image.convert("RGB")
    return _array(image, 3)


def _array(image: PILImage.Image, channels: int) -> Array:
    """A copy of an ``RGB`` or ``L`` image, a band of rows at a time: ``tobytes`` of the
    whole would hold the picture twice more at its peak."""
    width, height = image.size
    shape = (height, width, channels) if channels > 1 else (height, width)
    out = np.empty(shape, np.uint8)
    band = max(1, _BAND_BYTES // (width * channels))
    for top in range(0, height, band):
        rows = image if band >= height else image.crop((0, top, width, min(top + band, height)))
        out[top : top + rows.height] = np.frombuffer(rows.tobytes(), np.uint8).reshape(
            (rows.height, *shape[1:])
        )
    return out


def _image(pixels: Array) -> PILImage.Image:
    """An ``H x W``, ``H x W x 1`` or ``H x W x 3`` ``uint8`` array as a Pillow image
    (its channels taken as they are)."""
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    image: PILImage.Image = _pil().fromarray(np.ascontiguousarray(pixels, dtype=np.uint8))
    return image


def encode(rgb: Array, fmt: str, quality: int | None = None) -> bytes:
    """``rgb`` (``H x W x 3``) written as a file of format ``fmt`` (PNG for GIF, TIFF and
    any other), its pixels only; ``quality`` (1-100): a JPEG's, or a lossy WebP's
    (``None``: JPEG at 95, WebP lossless; PNG is always lossless)."""
    name, options = _WRITERS.get(fmt, _WRITERS["png"])
    if quality is not None and name in ("JPEG", "WEBP"):
        options = {"quality": quality}
    buffer = io.BytesIO()
    _image(rgb).save(buffer, format=name, **options)
    return buffer.getvalue()


def resize(pixels: Array, size: tuple[int, int], interpolation: str) -> Array:
    """``pixels`` (``H x W``, ``H x W x 1`` or ``H x W x 3`` ``uint8``) at ``size``
    (height, width), its shape kept; ``interpolation`` is one of :data:`INTERPOLATIONS`."""
    if pixels.shape[:2] == size:
        return pixels
    if interpolation == "cubic":
        height, width = size
        image = _image(pixels).resize((width, height), _pil().Resampling.BICUBIC)
        kept = (height, width, *pixels.shape[2:])
        return _array(image, 3 if image.mode == "RGB" else 1).reshape(kept)
    values: Array = pixels
    for axis, new in enumerate(size):
        if new == values.shape[axis]:
            continue
        index, weight = _taps(values.shape[axis], new, interpolation)
        shape = [1] * values.ndim
        shape[axis] = new
        out = np.take(values, index[0], axis=axis) * weight[0].reshape(shape)
        for taken, share in zip(index[1:], weight[1:], strict=True):
            out += np.take(values, taken, axis=axis) * share.reshape(shape)
        values = out
    resized: Array = np.clip(np.rint(values), 0, 255).astype(np.uint8)
    return resized


def _taps(old: int, new: int, interpolation: str) -> tuple[Array, Array]:
    """Which input pixels each output pixel weighs along one axis, and how much
    (``[taps, new]`` each), as OpenCV's ``resize`` samples: ``area`` shrinking, each
    input pixel by the share of it under the output pixel; growing, the nearest pixel
    blended at its edge; ``linear``, the two around the output pixel's centre (edges
    clamped); ``nearest``, the one at its top left corner."""
    scale = old / new
    at = np.arange(new, dtype=np.float64)
    if interpolation == "nearest":
        index, weight = np.floor(at * scale)[None, :], np.ones((1, new))
    elif interpolation == "area" and new < old:
        first = np.floor(at * scale)
        index = first[None, :] + np.arange(int(np.ceil(scale)) + 1)[:, None]
        covered = np.minimum(index + 1, (at + 1) * scale) - np.maximum(index, at * scale)
        weight = np.clip(covered, 0.0, None) / scale
    else:
        if interpolation == "area":
            first = np.floor(at * scale)
            fraction = (at + 1) - (first + 1) / scale
            fraction = np.where(fraction <= 0, 0.0, fraction - np.floor(fraction))
        else:
            centre = np.maximum((at + 0.5) * scale - 0.5, 0.0)
            first = np.floor(centre)
            fraction = centre - first
        index, weight = np.stack([first, first + 1]), np.stack([1 - fraction, fraction])
    return np.minimum(index, old - 1).astype(np.intp), weight.astype(np.float32)


def grey(pixels: Array, order: str = "rgb") -> Array:
    """The ``H x W`` grey of an RGB (or, ``order="bgr"``, BGR) picture: ITU-R 601 luma,
    as every grey model was trained on."""
    weights = (0.299, 0.587, 0.114) if order == "rgb" else (0.114, 0.587, 0.299)
    return _array(_image(pixels).convert("L", matrix=(*weights, 0.0)), 1)


def box_blur(pixels: Array, kernel: int) -> Array:
    """``pixels`` (``H x W [x C]`` ``uint8``) averaged over a ``kernel`` x ``kernel``
    window, the border reflected about its edge pixel (OpenCV's ``blur``)."""
    out = pixels.astype(np.float64)
    for axis in (0, 1):
        before, after = kernel // 2, kernel - 1 - kernel // 2
        pad = [(0, 0)] * out.ndim
        pad[axis] = (before, after)
        padded = np.pad(out, pad, mode="reflect")
        sums = np.cumsum(padded, axis=axis)
        zero = np.zeros_like(np.take(sums, [0], axis=axis))
        sums = np.concatenate([zero, sums], axis=axis)
        size = out.shape[axis]
        out = np.take(sums, np.arange(kernel, kernel + size), axis=axis) - np.take(
            sums, np.arange(size), axis=axis
        )
    blurred: Array = np.clip(np.rint(out * (1.0 / (kernel * kernel))), 0, 255).astype(np.uint8)
    return blurred


def max3x3(values: Array) -> Array:
    """Each element of a 2-D array replaced by the largest of its 3x3 neighbourhood
    (what lies outside counts for nothing: OpenCV's ``dilate``)."""
    padded = np.pad(values, 1, mode="constant", constant_values=-np.inf)
    rows = np.maximum(np.maximum(padded[:-2], padded[1:-1]), padded[2:])
    peaks: Array = np.maximum(np.maximum(rows[:, :-2], rows[:, 1:-1]), rows[:, 2:])
    return peaks.astype(values.dtype, copy=False)
