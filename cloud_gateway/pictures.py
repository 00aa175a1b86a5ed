"""Pictures that arrive encoded: a request whose picture input holds image files
(``BYTES``, one file a row) instead of the tensor its model takes is answered as the
tensor would be, the files decoded and preprocessed here as the model's manifest says
(:mod:`edge_core.pictures`, the same code the device runs on a picture it is handed).

This is how a device offloads a picture (a JPEG of a 640x480 frame is about 1/40 of
its FP32 tensor), and how any client may send one: the server metadata lists the
``edge_pictures`` extension. Bounded before anything is decoded: at most the rows a
request may hold, each file's pixels by its header (:data:`PICTURE_PIXELS`, or the
model's input when larger), and :data:`DECODING` requests' pictures at once; decoding
runs off the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from edge_core.errors import InputError
from edge_core.images import image_format
from edge_core.package import ModelPackage
from edge_core.pictures import EXTENSION, pictures_to_tensor
from edge_core.protocol.types import InferRequest
from edge_core.tensors import TensorSpec, numpy_dtype

__all__ = ["DECODING", "EXTENSION", "PICTURE_PIXELS", "decode_pictures", "picture_spec"]

# A file's pixels at most (by its header, before decoding): a 12 MP camera frame, whose
# decoded RGB takes 36 MB; a JPEG is decoded reduced towards the model's input.
PICTURE_PIXELS = 12_000_000
# Requests whose pictures are decoded at once, at most (the others wait their turn): a
# small PNG can decode to 36 MB, and a client may send many.
DECODING = 4


def picture_spec(
    package: ModelPackage, inputs: Sequence[TensorSpec], request: InferRequest
) -> TensorSpec | None:
    """The model's picture input when the request sends image files there and the model
    takes a tensor (one with image preprocessing in its manifest); else ``None``."""
    pre = package.preprocessing
    if pre is None or request.datatypes.get(pre.input) != "BYTES":
        return None
    spec = next((spec for spec in inputs if spec.name == pre.input), None)
    return spec if spec is not None and spec.datatype != "BYTES" else None


async def decode_pictures(
    package: ModelPackage, spec: TensorSpec, request: InferRequest, max_rows: int
) -> InferRequest:
    """The request with its picture input's files made the model's input tensor (in a
    thread: a 640x480 JPEG takes a few milliseconds to decode).

    Raises:
        InputError: more files than ``max_rows``, an element that is not an image file,
            one that does not decode or is too large, pictures of different sizes for
            a model that keeps each one's size.
    """
    pre = package.preprocessing
    assert pre is not None
    files = _files(request.inputs[pre.input], pre.input, max_rows)
    limit = max(PICTURE_PIXELS, pre.input_pixels)
    loop = asyncio.get_running_loop()
    tensor, _ = await loop.run_in_executor(
        None, lambda: pictures_to_tensor(files, pre, package.name, max_pixels=limit)
    )
    inputs = {**request.inputs, pre.input: tensor.astype(numpy_dtype(spec.datatype), copy=False)}
    datatypes = {**request.datatypes, pre.input: spec.datatype}
    return replace(request, inputs=inputs, datatypes=datatypes, raw=None)


def _files(value: np.ndarray[Any, Any], name: str, max_rows: int) -> list[bytes]:
    items = list(value.reshape(-1))
    if not items:
        raise InputError(f"input {name!r}: no picture")
    if len(items) > max_rows:
        raise InputError(f"input {name!r}: {len(items)} pictures, at most {max_rows} a request")
    for index, item in enumerate(items):
        if not isinstance(item, bytes) or image_format(item) is None:
            raise InputError(
                f"input {name!r}: element {index} is not an image file (expected JPEG, PNG, "
                "WebP, BMP, GIF or TIFF, or the tensor the model takes)"
            )
    return items
