"""Image files to input tensors, as a model's manifest describes, and back.

A file's header is read before it is decoded, and a picture over the pixel limit is
refused (:mod:`edge_core.images`); a JPEG much larger than the model's input is
decoded at a fraction of its size. The pixels are decoded, converted and resized by
:mod:`edge_agent.imaging` (Pillow, imported on first use: a device that is never handed
an image file does not load it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_agent import imaging
from edge_core.errors import InputError
from edge_core.images import MAX_IMAGE_PIXELS, ImageHeader, check_pixels, image_format, probe
from edge_core.package import ImagePreprocessing, ModelPackage

__all__ = [
    "ImageView",
    "decode_image",
    "encoded_pictures",
    "image_to_tensor",
    "picture_to_tensor",
    "tensor_to_image",
]

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


def encoded_pictures(
    package: ModelPackage, inputs: dict[str, Array], *, max_pixels: int = MAX_IMAGE_PIXELS
) -> tuple[dict[str, Array], list[tuple[int, int]] | None]:
    """``inputs`` with the model's picture input, when it comes as image files, decoded and
    preprocessed as the manifest says (as ``edge-agent infer`` reads an image file); and
    each picture's height and width (``None``: no files came).

    Files come as ``BYTES`` elements (one a picture), or as a ``uint8`` tensor of one
    file (1-D) or of one file a row (2-D, rows of equal length); each must start as an
    image file does (PNG, JPEG, BMP, GIF, TIFF, WebP). Anything else is left as it is,
    for the runtime's own checks. A model without image preprocessing is left alone.

    Raises:
        InputError: a file that says it is a picture does not decode, or is over
            ``max_pixels``.
    """
    pre = package.preprocessing
    value = inputs.get(pre.input) if pre is not None else None
    if pre is None or value is None:
        return inputs, None
    files = _files(value)
    if files is None:
        return inputs, None
    read = [picture_to_tensor(data, pre, max_pixels=max_pixels) for data in files]
    tensors = [tensor for tensor, _ in read]
    if len({t.shape for t in tensors}) > 1:  # a model that keeps each picture's size
        raise InputError(
            f"input {pre.input!r}: pictures of different sizes make inputs of different "
            f"shapes for {package.name}, and a batch takes one: send them one a request"
        )
    return {**inputs, pre.input: np.concatenate(tensors)}, [hw for _, hw in read]


def _files(value: Array) -> list[bytes] | None:
    if value.dtype == object:
        items = list(value.reshape(-1))
        if items and all(isinstance(v, bytes) and image_format(v) for v in items):
            return items
        return None
    if value.dtype == np.uint8 and value.ndim in (1, 2) and value.size:
        rows = [value.tobytes()] if value.ndim == 1 else [row.tobytes() for row in value]
        if all(image_format(row) for row in rows):
            return rows
    return None


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


@dataclass
class ImageView:
    """One image item of an input tensor as a picture, and the way back.

    ``size`` is the picture's height and width, known without making it; ``rgb`` is
    the ``H x W x 3`` ``uint8`` picture, made by ``render`` when first asked for (a
    picture too small to search is never converted); ``encode`` turns a picture of the
    same size back into a tensor item of the original layout and dtype.
    """

    size: tuple[int, int]
    render: Callable[[], Array]
    encode: Callable[[Array], Array]

    @functools.cached_property
    def rgb(self) -> Array:
        return self.render()


def tensor_to_image(item: Array, pre: ImagePreprocessing | None) -> ImageView | None:
    """The picture an input item shows, or ``None`` when it is not an image.

    With the manifest's preprocessing the mapping is inverted exactly; without
    it, a 3-D item with 1 or 3 channels (HWC or CHW) is taken as an image whose
    values are stretched to 0..255.
    """
    if pre is not None:
        return _known_layout(item, pre)
    return _guessed_layout(item)


def _known_layout(item: Array, pre: ImagePreprocessing) -> ImageView | None:
    channels = 1 if pre.color == "gray" else 3
    if pre.layout == "NF":
        if pre.size is None or item.size != pre.size[0] * pre.size[1] * channels:
            return None
        hwc = item.reshape(pre.size[0], pre.size[1], channels)
    elif pre.layout == "NCHW":
        if item.ndim != 3 or item.shape[0] != channels:
            return None
        hwc = item.transpose(1, 2, 0)
    else:
        if item.ndim != 3 or item.shape[2] != channels:
            return None
        hwc = item
    low, high = pre.value_range

    def render() -> Array:
        with np.errstate(over="ignore", invalid="ignore"):  # any values a caller sends: clipped
            values = hwc.astype(np.float32)
            if pre.std is not None:
                values = values * np.asarray(pre.std, np.float32)
            if pre.mean is not None:
                values = values + np.asarray(pre.mean, np.float32)
            scaled = np.nan_to_num((values - low) * (255.0 / (high - low)), nan=0.0)
            pixels = np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
        if channels == 1:
            rgb = np.repeat(pixels, 3, axis=2)
        elif pre.color == "bgr":
            rgb = pixels[:, :, ::-1]
        else:
            rgb = pixels
        return np.ascontiguousarray(rgb)

    shape, dtype = item.shape, item.dtype

    def encode(picture: Array) -> Array:
        if channels == 1:
            chosen = picture.astype(np.float32).mean(axis=2, keepdims=True)
        elif pre.color == "bgr":
            chosen = picture[:, :, ::-1].astype(np.float32)
        else:
            chosen = picture.astype(np.float32)
        tensor = chosen * np.float32((high - low) / 255.0) + np.float32(low)
        if pre.mean is not None:
            tensor -= np.asarray(pre.mean, np.float32)
        if pre.std is not None:
            tensor /= np.asarray(pre.std, np.float32)
        if pre.layout == "NCHW":
            tensor = tensor.transpose(2, 0, 1)
        return np.ascontiguousarray(tensor.reshape(shape)).astype(dtype)

    return ImageView((hwc.shape[0], hwc.shape[1]), render, encode)


def _guessed_layout(item: Array) -> ImageView | None:
    """A 2-D grey picture, or a 3-D one in HWC or CHW with 1, 3 or 4 (alpha) channels."""
    if item.dtype.kind not in "buif" or item.ndim not in (2, 3):
        return None
    if item.ndim == 2:
        if min(item.shape) < 8:
            return None
        hwc, chw = item[:, :, None], False
    elif item.shape[0] in (1, 3, 4) and min(item.shape[1:]) >= 8:
        hwc, chw = item.transpose(1, 2, 0), True
    elif item.shape[2] in (1, 3, 4) and min(item.shape[:2]) >= 8:
        hwc, chw = item, False
    else:
        return None
    channels = hwc.shape[2]
    alpha = hwc[:, :, 3:] if channels == 4 else None
    colour = hwc[:, :, :3] if channels == 4 else hwc
    values = colour.astype(np.float32)
    low, high = float(values.min()), float(values.max())
    span = high - low if high > low else 1.0
    pixels = np.clip(np.rint((values - low) * (255.0 / span)), 0, 255).astype(np.uint8)
    rgb = np.repeat(pixels, 3, axis=2) if pixels.shape[2] == 1 else pixels
    shape, dtype = item.shape, item.dtype

    def encode(picture: Array) -> Array:
        chosen = picture.astype(np.float32)
        if channels == 1:
            chosen = chosen.mean(axis=2, keepdims=True)
        tensor = chosen * np.float32(span / 255.0) + np.float32(low)
        if alpha is not None:
            tensor = np.concatenate([tensor, alpha.astype(np.float32)], axis=2)
        if chw:
            tensor = tensor.transpose(2, 0, 1)
        return np.ascontiguousarray(tensor.reshape(shape)).astype(dtype)

    picture = np.ascontiguousarray(rgb)
    return ImageView((hwc.shape[0], hwc.shape[1]), lambda: picture, encode)
