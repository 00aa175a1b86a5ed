"""Tensors packed for the wire: exact, only where it pays, bounded when unpacked."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

from edge_core.errors import InputError, PayloadTooLarge
from edge_core.protocol import packed


def sparse_map() -> np.ndarray:
    """A detector's map: mostly zeros, a few blobs (PP-OCR's text map is like it)."""
    scores = np.zeros((1, 1, 480, 640), np.float32)
    scores[0, 0, 100:140, 200:400] = np.linspace(0.5, 0.99, 200, dtype=np.float32)
    return scores


def test_a_large_tensor_that_compresses_is_packed_and_unpacked_exactly() -> None:
    scores = sparse_map()
    small = np.arange(10, dtype=np.float32).reshape(1, 10)
    arrays, datatypes, descriptor = packed.pack({"map": scores, "top": small})
    assert descriptor is not None
    assert datatypes == {"map": "BYTES", "top": "FP32"}
    assert arrays["top"] is small  # under MIN_BYTES: as it is
    blob = arrays["map"][0]
    assert isinstance(blob, bytes) and len(blob) < scores.nbytes / 50
    assert json.loads(descriptor) == {"map": ["FP32", [1, 1, 480, 640]]}
    back, types = packed.unpack(arrays, datatypes, descriptor, max_bytes=scores.nbytes)
    assert types == {"map": "FP32", "top": "FP32"}
    assert back["map"].dtype == np.float32 and np.array_equal(back["map"], scores)
    assert back["top"] is small


def test_what_does_not_compress_is_left_as_it_is() -> None:
    noise = np.random.default_rng(0).standard_normal((64, 1024)).astype(np.float32)
    arrays, datatypes, descriptor = packed.pack({"x": noise})
    assert descriptor is None and arrays["x"] is noise and datatypes == {"x": "FP32"}
    files = np.empty(1, dtype=object)
    files[0] = bytes(100_000)  # BYTES are never packed (a picture is encoded already)
    assert packed.pack({"f": files}, {"f": "BYTES"})[2] is None


def test_unpacking_is_bounded_before_it_starts() -> None:
    scores = sparse_map()
    arrays, datatypes, descriptor = packed.pack({"map": scores})
    with pytest.raises(PayloadTooLarge, match="more than the 1,024 a message may hold"):
        packed.unpack(arrays, datatypes, descriptor, max_bytes=1024)
    # a stream that inflates to more than it declares: refused after the bytes declared
    bomb = np.empty(1, dtype=object)
    bomb[0] = zlib.compress(bytes(10_000_000))
    declared = json.dumps({"map": ["FP32", [1, 10]]})
    with pytest.raises(InputError, match="does not inflate to the 40 bytes declared"):
        packed.unpack({"map": bomb}, {"map": "BYTES"}, declared, max_bytes=10**9)


@pytest.mark.parametrize(
    ("descriptor", "message"),
    [
        ("not json", "must be a JSON object"),
        (json.dumps({"map": "FP32"}), r"expected \[datatype, shape\]"),
        (json.dumps({"map": ["FP99", [1]]}), "unknown datatype"),
        (json.dumps({"map": ["BYTES", [1]]}), "a BYTES tensor is never packed"),
        (json.dumps({"map": ["FP32", [-1]]}), "non-negative integers"),
        (json.dumps({"gone": ["FP32", [1]]}), "expected one BYTES element"),
        (7, "must be a JSON object"),
        ("[" * 100_000, "longer than 65,536 characters"),
        ("[" * 50_000, "must be a JSON object"),  # nested past the parser's depth
    ],
)
def test_a_malformed_descriptor_is_an_input_error(descriptor: object, message: str) -> None:
    element = np.empty(1, dtype=object)
    element[0] = zlib.compress(bytes(4))
    with pytest.raises(InputError, match=message):
        packed.unpack({"map": element}, {"map": "BYTES"}, descriptor, max_bytes=10**6)


def test_a_stream_that_is_not_zlib_is_an_input_error() -> None:
    element = np.empty(1, dtype=object)
    element[0] = b"\x00not zlib at all"
    with pytest.raises(InputError, match="not a zlib stream"):
        packed.unpack(
            {"map": element}, {"map": "BYTES"}, json.dumps({"map": ["FP32", [1]]}), max_bytes=64
        )
