"""Image files to a model's input tensors, as its manifest's preprocessing says: what
the device does with a picture it is handed, and what the gateway does with a picture
a device offloads encoded (both from the same manifest, so that both make the same
tensor).

A file's header is read before it is decoded, and a picture over the pixel limit is
refused (:mod:`edge_core.images`); a JPEG much larger than the model's input is
decoded at a fraction of its size. The pixels are decoded, converted and resized by
:mod:`edge_core.imaging` (Pillow, imported on first use).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edge_core import imaging
from edge_core.errors import InputError
from edge_core.images import MAX_IMAGE_PIXELS, ImageHeader, check_pixels, probe
from edge_core.package import ImagePreprocessing

__all__ = [
    "EXTENSION",
    "decode_image",
    "image_to_tensor",
    "picture_to_tensor",
    "pictures_to_tensor",
]

# A server that takes a picture input's image files in place of its tensor lists this
# protocol extension in its metadata (the gateway does; a device's offload sends
# pictures encoded only to a server that lists it).
EXTENSION = "edge_pictures"

Array = np.ndarray[Any, Any]


def decode_image(
    data: bytes,
    *,
    max_pixels: int = MAX_IMAGE_PIXELS,
    reduce_to: tuple[int, int] | None = None,
) -> Array:
    """Decode an image file into an ``H x W x 3`` BGR ``uint8`` array, its header read
    first (:func:`edge_core.images.probe`): a picture of more than ``max_pixels``
    is refused before anything is decoded.

    ``reduce_to``: the (height, width) the picture is on its way to; a JPEG at least
    twice as large each way is decoded at 1/2, 1/4 or 1/8 of its size (libjpeg
    scales as it decodes, so the full picture is never held), never below it.

    Raises:
        InputError: not a JPEG, PNG, WebP, BMP, GIF or TIFF file, a picture over
            ``max_pixels``, or one that is corrupt or cut short.
    """
    return _decode(data, _header(data, max_pixels), reduce_to)


def _header(data: bytes, max_pixels: int) -> ImageHeader:
    header = probe(data)
    if header is None:
        raise InputError("cannot decode the image (expected JPEG, PNG, WebP, BMP, GIF or TIFF)")
    check_pixels(header, max_pixels)
    return header


def _decode(data: bytes, header: ImageHeader, reduce_to: tuple[int, int] | None) -> Array:
    rgb = imaging.decode(data, header, reduce_to)
    return np.ascontiguousarray(rgb[:, :, ::-1])  # BGR: what OpenCV's frames are


def picture_to_tensor(
    data: bytes, pre: ImagePreprocessing, *, max_pixels: int = MAX_IMAGE_PIXELS
) -> tuple[Array, tuple[int, int]]:
    """An image file as the model's input (a batch of one), and the picture's own
    height and width: decoded within ``max_pixels``, at a reduced size when the
    input is much smaller (:func:`decode_image`), then :func:`image_to_tensor`.

    Raises:
        InputError: see :func:`decode_image`.
    """
    header = _header(data, max_pixels)
    hw = (header.height, header.width)
    target = pre.input_size(*hw) if pre.fit == "none" else None  # a crop needs every pixel
    return _to_tensor(imaging.decode(data, header, target), pre, "rgb"), hw


def pictures_to_tensor(
    files: Sequence[bytes], pre: ImagePreprocessing, model: str, *, max_pixels: int
) -> tuple[Array, list[tuple[int, int]]]:
    """Image files as one batch of the model's input (a row each), and each picture's
    height and width.

    Raises:
        InputError: a file does not decode, is over ``max_pixels``, or the pictures
            make inputs of different shapes (a model that keeps each picture's size).
    """
    read = [picture_to_tensor(data, pre, max_pixels=max_pixels) for data in files]
    tensors = [tensor for tensor, _ in read]
    if len({t.shape for t in tensors}) > 1:  # a model that keeps each picture's size
        raise InputError(
            f"input {pre.input!r}: pictures of different sizes make inputs of different "
            f"shapes for {model}, and a batch takes one: send them one a request"
        )
    return np.concatenate(tensors), [hw for _, hw in read]


def _fit_box(pixels: Array) -> Array:
    """The smallest square around what stands out from the (dark) background, the
    thing centred in it; the whole picture when nothing does."""
    brightness = pixels.max(axis=2)
    threshold = int(brightness.min()) + (int(brightness.max()) - int(brightness.min())) // 8
    rows = np.flatnonzero((brightness > threshold).any(axis=1))
    cols = np.flatnonzero((brightness > threshold).any(axis=0))
    if rows.size == 0:
        return pixels
    if rows[-1] - rows[0] >= 0.85 * pixels.shape[0] or cols[-1] - cols[0] >= 0.85 * pixels.shape[1]:
        return pixels  # it fills the frame already: a crop would only move it
    crop = pixels[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    height, width = crop.shape[:2]
    side = max(height, width)
    square = np.full((side, side, pixels.shape[2]), brightness.min(), dtype=pixels.dtype)
    top, left = (side - height) // 2, (side - width) // 2
    square[top : top + height, left : left + width] = crop
    return square


def image_to_tensor(image: Array, pre: ImagePreprocessing) -> Array:
    """A BGR ``uint8`` image -> a batch of one input tensor (``float32``)."""
    return _to_tensor(image, pre, "bgr")


def _to_tensor(image: Array, pre: ImagePreprocessing, order: str) -> Array:
    """An RGB or BGR (``order``) ``uint8`` image -> a batch of one input tensor."""
    pixels = imaging.grey(image, order)[:, :, None] if pre.color == "gray" else image
    if pre.fit == "box":
        pixels = _fit_box(pixels)
    height, width = pixels.shape[:2]
    target = pre.input_size(height, width)
    if target != (height, width):
        pixels = imaging.resize(pixels, target, pre.interpolation)
    if pre.color != "gray" and pre.color != order:
        pixels = pixels[:, :, ::-1]  # after the resize: fewer pixels to turn round
    low, high = pre.value_range
    tensor = pixels.astype(np.float32) * np.float32((high - low) / 255.0) + np.float32(low)
    if pre.mean is not None:
        tensor -= np.asarray(pre.mean, dtype=np.float32)
    if pre.std is not None:
        tensor /= np.asarray(pre.std, dtype=np.float32)
    if pre.layout == "NCHW":
        tensor = tensor.transpose(2, 0, 1)
    elif pre.layout == "NF":
        tensor = tensor.reshape(-1)
    return np.ascontiguousarray(tensor[None])
