"""Image files to input tensors, as a model's manifest describes (OpenCV).

OpenCV is imported on first use only: a device that is never handed an
image file does not load it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edge_agent.errors import InputError
from edge_agent.package import ImagePreprocessing

__all__ = ["decode_image", "image_to_tensor"]

Array = np.ndarray[Any, Any]


def _cv2() -> Any:
    import cv2

    return cv2


def decode_image(data: bytes) -> Array:
    """Decode PNG/JPEG/... bytes into an ``H x W x 3`` BGR ``uint8`` array.

    Raises:
        InputError: the bytes are not an image OpenCV can decode.
    """
    cv2 = _cv2()
    image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise InputError(
            "cannot decode the image (expected PNG, JPEG, BMP or another format OpenCV reads)"
        )
    return np.asarray(image)


def _round_to(value: int, multiple: int) -> int:
    return max(multiple, round(value / multiple) * multiple)


def image_to_tensor(image: Array, pre: ImagePreprocessing) -> Array:
    """A BGR ``uint8`` image -> a batch of one input tensor (``float32``)."""
    cv2 = _cv2()
    if pre.color == "gray":
        pixels = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)[:, :, None]
    elif pre.color == "rgb":
        pixels = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    else:
        pixels = image
    height, width = pixels.shape[:2]
    if pre.size is not None:
        target = pre.size
    else:
        target = (_round_to(height, pre.multiple_of), _round_to(width, pre.multiple_of))
    if target != (height, width):
        interpolation = {
            "area": cv2.INTER_AREA,
            "linear": cv2.INTER_LINEAR,
            "nearest": cv2.INTER_NEAREST,
            "cubic": cv2.INTER_CUBIC,
        }[pre.interpolation]
        resized = cv2.resize(pixels, (target[1], target[0]), interpolation=interpolation)
        pixels = resized.reshape(target[0], target[1], pixels.shape[2])
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
