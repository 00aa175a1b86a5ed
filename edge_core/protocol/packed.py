"""Tensors packed for the wire: a large tensor that compresses leaves as one zlib
stream, exactly as it was, and is unpacked on the other side before anything reads it.

A detector's map is mostly zeros (PP-OCR's text map of a 640x480 picture: 1.2 MB as
FP32, a few KB packed), a classifier's scores are small: only a tensor of at least
:data:`MIN_BYTES` is tried, and kept packed only when that saves :data:`MIN_SAVING` of
its bytes. A packed tensor travels as a ``BYTES`` tensor of one element (every
transport and codec carries those as they are), and the message's ``edge_packed``
parameter (a JSON string: gRPC's parameters hold no maps) names each packed tensor's
own datatype and shape.

Negotiated, never assumed: a gateway that unpacks lists :data:`EXTENSION` in its
server metadata, and packs its outputs only for a request that asks (:data:`ASK`).
Unpacking is bounded before it starts: the declared datatype and shape give the
exact byte count, which must be within the receiver's limit, and zlib is never let
to produce more than it.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from edge_core.errors import InputError, PayloadTooLarge
from edge_core.protocol.types import array_from_bytes, array_to_bytes, check_datatype, check_shape
from edge_core.tensors import datatype_of, numpy_dtype

__all__ = ["ASK", "EXTENSION", "MIN_BYTES", "PARAMETER", "pack", "unpack"]

EXTENSION = "edge_compression"
PARAMETER = "edge_packed"  # in a request or response: which tensors are packed, and as what
ASK = "edge_compress"  # in a request (true): pack the outputs of the answer
MIN_BYTES = 16 * 1024
MIN_SAVING = 0.1
MAX_DESCRIPTOR = 64 * 1024  # characters: a few hundred tensors' names and shapes
LEVEL = 1  # zlib's fastest: about 2 ms a megabyte here, within a few percent of level 6

Array = np.ndarray[Any, Any]


def pack(
    arrays: Mapping[str, Array], datatypes: Mapping[str, str] | None = None
) -> tuple[dict[str, Array], dict[str, str], str | None]:
    """``arrays`` with each large tensor that compresses packed, their datatypes, and the
    ``edge_packed`` parameter's value (``None``: nothing was packed)."""
    out: dict[str, Array] = {}
    types: dict[str, str] = {}
    packed: dict[str, list[Any]] = {}
    for name, array in arrays.items():
        datatype = (datatypes or {}).get(name) or datatype_of(array.dtype)
        out[name], types[name] = array, datatype
        if datatype == "BYTES" or array.nbytes < MIN_BYTES:
            continue
        blob = zlib.compress(array_to_bytes(array, datatype), LEVEL)
        if len(blob) > (1 - MIN_SAVING) * array.nbytes:
            continue
        element: Array = np.empty(1, dtype=object)
        element[0] = blob
        out[name], types[name] = element, "BYTES"
        packed[name] = [datatype, list(array.shape)]
    if not packed:
        return out, types, None
    return out, types, json.dumps(packed, separators=(",", ":"))


def unpack(
    arrays: Mapping[str, Array],
    datatypes: Mapping[str, str],
    descriptor: Any,
    *,
    max_bytes: int,
) -> tuple[dict[str, Array], dict[str, str]]:
    """``arrays`` with the tensors ``descriptor`` (the ``edge_packed`` parameter) names
    unpacked, and their datatypes.

    Raises:
        InputError: the descriptor is malformed, names a tensor that is not there or is
            not one packed element, or a stream does not inflate to exactly the bytes
            declared.
        PayloadTooLarge: the tensors declare more than ``max_bytes`` in all.
    """
    entries = _entries(descriptor)
    out, types = dict(arrays), dict(datatypes)
    budget = max_bytes
    for name, (datatype, shape) in entries.items():
        where = f"packed tensor {name!r}"
        value = arrays.get(name)
        if value is None or value.dtype != object or value.size != 1:
            raise InputError(f"{where}: expected one BYTES element holding its zlib stream")
        blob = value.reshape(-1)[0]
        if not isinstance(blob, bytes):
            raise InputError(f"{where}: its element is not bytes")
        size = int(np.prod(shape, dtype=np.int64)) * numpy_dtype(datatype).itemsize
        if size > budget:
            raise PayloadTooLarge(
                f"{where}: {size:,} bytes unpacked, more than the {max_bytes:,} a message may hold"
            )
        budget -= size
        out[name] = array_from_bytes(_inflate(blob, size, where), datatype, shape, where)
        types[name] = datatype
    return out, types


def _entries(descriptor: Any) -> dict[str, tuple[str, list[int]]]:
    """The descriptor's tensors: name -> (datatype, shape), each checked."""
    if isinstance(descriptor, str) and len(descriptor) > MAX_DESCRIPTOR:
        raise InputError(f"parameter {PARAMETER!r} is longer than {MAX_DESCRIPTOR:,} characters")
    try:
        document = json.loads(descriptor) if isinstance(descriptor, str) else None
    except (ValueError, RecursionError):  # malformed, or nested past the parser's depth
        document = None
    if not isinstance(document, dict):
        raise InputError(f"parameter {PARAMETER!r} must be a JSON object (a string)")
    entries = {}
    for name, entry in document.items():
        where = f"packed tensor {name!r}"
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)):
            raise InputError(f"{where}: expected [datatype, shape]")
        datatype = check_datatype(entry[0], where)
        if datatype == "BYTES":
            raise InputError(f"{where}: a BYTES tensor is never packed")
        entries[name] = (datatype, check_shape(entry[1], where))
    return entries


def _inflate(blob: bytes, size: int, where: str) -> bytes:
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(blob, size + 1)
    except zlib.error as exc:
        raise InputError(f"{where}: not a zlib stream ({exc})") from None
    if len(data) != size or not inflater.eof or inflater.unconsumed_tail:
        raise InputError(f"{where}: its stream does not inflate to the {size:,} bytes declared")
    return data
