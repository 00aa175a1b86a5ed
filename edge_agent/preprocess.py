"""A request's image files to input tensors, as a model's manifest describes
(:mod:`edge_core.pictures`, which the gateway shares), and input tensors back to
pictures (:func:`tensor_to_image`: what the privacy checks search and redact, and what
an offload sends encoded).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_core.images import MAX_IMAGE_PIXELS, image_format
from edge_core.package import ImagePreprocessing, ModelPackage
from edge_core.pictures import pictures_to_tensor

__all__ = ["ImageView", "encoded_pictures", "tensor_to_image"]

Array = np.ndarray[Any, Any]


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
    tensor, sizes = pictures_to_tensor(files, pre, package.name, max_pixels=max_pixels)
    return {**inputs, pre.input: tensor}, sizes


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
