"""The form a request leaves the device in: the smallest one the gateway takes.

- **Pictures leave as pictures.** For a model whose manifest has image preprocessing,
  the picture input leaves as image files (``BYTES``, one a row): JPEG by default, at
  the policy's quality; WebP; PNG where the manifest says the model needs every pixel
  (``lossless``). The gateway makes the tensor from them with the same manifest
  (``edge_pictures``). A 640x480 frame for PP-OCR's detector is a 3.7 MB FP32 tensor,
  and a JPEG of 50-150 KB.

  The picture is the input tensor's own (:func:`~edge_agent.preprocess.tensor_to_image`
  inverts the preprocessing), at the input's size, so that the gateway resizes nothing
  and the answer is the tensor's up to the encoding's loss. A redacted picture is
  checked in its redaction as it will be seen (:func:`round_trip`: an encoding's
  artefacts can make a face of what was none), and searched again as encoded by the
  exit guard. Only where that holds: a
  layout with sides (``NHWC``, ``NCHW``), no ``fit`` crop (the gateway would crop the
  crop again), and files smaller than the tensor.
- **The quality steps down to meet a deadline**, by :data:`QUALITY_STEP`, never below
  the manifest's ``min_quality`` (without one, never below the policy's quality; with
  one above the policy's quality, that one).
- **Other tensors are packed**: each large one that compresses leaves as a zlib
  stream (:mod:`edge_core.protocol.packed`, exact), and the answer's are asked for
  packed too.

Each form only for a gateway that lists its extension: anything else leaves as it
came.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from edge_agent.preprocess import tensor_to_image
from edge_core import imaging
from edge_core.images import probe
from edge_core.package import ImagePreprocessing, ModelPackage
from edge_core.pictures import EXTENSION as PICTURES
from edge_core.protocol import packed
from edge_core.protocol.types import InferRequest

__all__ = [
    "QUALITY_STEP",
    "WireForm",
    "encode_pictures",
    "packed_form",
    "round_trip",
    "wire_bytes",
    "wire_form",
]

QUALITY_STEP = 15

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class WireForm:
    """A request as it leaves (its pictures encoded), the bytes of its tensors before,
    and the extensions the gateway listed (what :func:`packed_form` may use)."""

    request: InferRequest
    raw_bytes: int
    extensions: Set[str]


def wire_bytes(request: InferRequest) -> int:
    """The bytes a request's tensors take on the wire."""
    total = 0
    for array in request.inputs.values():
        if array.dtype == object:
            total += sum(4 + len(item) for item in array.reshape(-1) if isinstance(item, bytes))
        else:
            total += array.nbytes
    return total


def wire_form(
    request: InferRequest,
    package: ModelPackage | None,
    extensions: Set[str],
    *,
    picture_format: str,
    quality: int,
    fits: Callable[[int], bool] = lambda nbytes: True,
) -> WireForm:
    """``request`` with its pictures in the form ``extensions`` allow (see the module's
    docstring): what the exit guard checks. ``fits(bytes)``: whether an exchange of that
    many bytes up meets the request's deadline (a picture that does not is encoded
    again at a lower quality, within the manifest's bounds)."""
    raw = sum(array.nbytes for array in request.inputs.values() if array.dtype != object)
    pre = package.preprocessing if package is not None else None
    if PICTURES in extensions and pre is not None and picture_format != "tensor":
        request = _pictures(request, pre, picture_format, quality, fits)
    return WireForm(request, raw, extensions)


def packed_form(request: InferRequest, extensions: Set[str]) -> InferRequest:
    """``request`` with its large tensors packed and its answer's asked for packed,
    where the gateway unpacks. Lossless: the exit guard checks the request before (a
    packed picture is no picture it could search)."""
    if packed.EXTENSION not in extensions:
        return request
    inputs, datatypes, descriptor = packed.pack(request.inputs, request.datatypes)
    parameters = {**request.parameters, packed.ASK: True}
    if descriptor is not None:
        parameters[packed.PARAMETER] = descriptor
    return replace(request, inputs=inputs, datatypes=datatypes, parameters=parameters)


def _pictures(
    request: InferRequest,
    pre: ImagePreprocessing,
    fmt: str,
    quality: int,
    fits: Callable[[int], bool],
) -> InferRequest:
    """The request with its pictures encoded: losslessly (PNG) where the manifest or
    the policy says so; else at the highest quality on the way down to the manifest's
    ``min_quality`` that ``fits`` (never below it, whatever the policy's quality)."""
    if pre.lossless or fmt == "png":
        return encode_pictures(request, pre, "png", None)
    floor = pre.min_quality or quality
    quality = max(quality, floor)
    while True:
        encoded = encode_pictures(request, pre, fmt, quality)
        if encoded is request or quality <= floor or fits(wire_bytes(encoded)):
            return encoded
        quality = max(quality - QUALITY_STEP, floor)


def round_trip(pre: ImagePreprocessing, fmt: str, quality: int) -> Callable[[Array], Array] | None:
    """What a picture becomes on its way to the gateway, as a function of its pixels
    (``H x W x 3`` RGB ``uint8`` in and out), where it leaves encoded with loss; ``None``
    where it leaves as it is (a tensor, PNG, a layout that is not encoded)."""
    if fmt in ("tensor", "png") or pre.lossless or pre.fit != "none" or pre.layout == "NF":
        return None

    def seen(rgb: Array) -> Array:
        blob = imaging.encode(rgb, fmt, quality)
        header = probe(blob)
        assert header is not None  # what Pillow just wrote
        return imaging.decode(blob, header, None)

    return seen


def encode_pictures(
    request: InferRequest, pre: ImagePreprocessing, fmt: str, quality: int | None
) -> InferRequest:
    """``request`` with its picture input as image files (``BYTES``, one a row), or
    ``request`` itself where a picture cannot stand for the tensor (see the module's
    docstring)."""
    if pre.fit != "none" or pre.layout == "NF":
        return request
    value = request.inputs.get(pre.input)
    if value is None or value.dtype == object or value.ndim != 4 or not value.size:
        return request
    files: list[bytes] = []
    for item in value:
        view = tensor_to_image(item, pre)
        if view is None:
            return request
        files.append(imaging.encode(view.rgb, fmt, quality))
    if sum(len(f) for f in files) >= value.nbytes:
        return request
    encoded: Array = np.empty(len(files), dtype=object)
    encoded[:] = files
    return replace(
        request,
        inputs={**request.inputs, pre.input: encoded},
        datatypes={**request.datatypes, pre.input: "BYTES"},
    )
