"""Protocol-neutral inference requests and responses (Open Inference Protocol).

Both front ends of the gateway, the agent's local API and the offload
transports translate their wire format to and from these, so the data plane
never sees JSON or protobuf. Tensors are NumPy arrays of the declared
datatype (``BYTES`` tensors are object arrays of ``bytes``).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_core.errors import ProtocolError
from edge_core.tensors import DATATYPES, numpy_dtype

__all__ = [
    "SERVER_TIME",
    "SERVER_US",
    "InferRequest",
    "InferResponse",
    "RawAnswer",
    "RawRequest",
    "RequestedOutput",
    "array_from_bytes",
    "array_to_bytes",
    "check_datatype",
    "check_shape",
    "element_count",
    "parse_length",
]

Array = np.ndarray[Any, Any]

MAX_TIMEOUT_US = 2**63 - 1  # what gRPC's int64_param holds
# A request's parameter (true): tell me the time you held me, as the answer's SERVER_US
# (microseconds): how a device tells its link's share of a round trip.
SERVER_TIME = "edge_server_time"
SERVER_US = "edge_server_us"
_LENGTH = re.compile(r"[0-9]{1,19}")


@dataclass
class RequestedOutput:
    name: str
    binary_data: bool | None = None  # REST: None = as the request's binary_data_output says


@dataclass(frozen=True)
class RawRequest:
    """A REST request's inputs, every one binary data, as its client sent them: the
    byte count of each input (in the order of :attr:`InferRequest.inputs`) and the
    tensor bytes after the JSON header. A gateway forwards these to an HTTP engine
    without encoding the tensors again; the header it writes from what it checked."""

    sizes: tuple[int, ...]
    binary: memoryview


@dataclass(frozen=True)
class RawAnswer:
    """A REST answer as an engine sent it: the body, where its JSON ends (``None``:
    all JSON) and which outputs it carries as binary data. A gateway relays it as it
    is when it is what its own client asked for."""

    body: bytes
    header_length: int | None
    binary: frozenset[str]


@dataclass
class InferRequest:
    """One inference request.

    ``inputs`` maps names to arrays of the datatypes in ``datatypes``.
    ``outputs`` is ``None`` for "all outputs". ``model_version`` is ``""`` for
    the newest. ``timeout_us`` is the protocol's ``timeout`` parameter. ``raw``: the
    body as it came, when the server that decoded it asked to keep it.
    """

    inputs: dict[str, Array]
    datatypes: dict[str, str]
    model_name: str = ""
    model_version: str = ""
    id: str = ""
    outputs: list[RequestedOutput] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    binary_output: bool = False
    raw: RawRequest | None = field(default=None, repr=False, compare=False)

    @property
    def timeout_us(self) -> int | None:
        value = self.parameters.get("timeout")
        if value is None:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not 0 <= value <= MAX_TIMEOUT_US
        ):
            raise ProtocolError(
                "parameter 'timeout' must be a non-negative integer (microseconds) of at most "
                f"{MAX_TIMEOUT_US}, got {value!r:.40}"
            )
        return value


@dataclass
class InferResponse:
    """One inference answer; ``raw``: the engine's body, when it is to be relayed as it
    is (set only where the outputs are exactly the ones it holds)."""

    model_name: str
    model_version: str
    outputs: dict[str, Array]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    raw: RawAnswer | None = field(default=None, repr=False, compare=False)
    # not of the protocol: the bytes the exchange took on the wire, sent and received,
    # as a device's transport counted them (None: not counted)
    wire_bytes: tuple[int, int] | None = field(default=None, repr=False, compare=False)


def parse_length(text: str, what: str) -> int:
    """A length or count sent as text (a header, an MQTT property): decimal ASCII digits.

    At most 19 digits, checked before ``int()`` sees them: Python refuses to convert
    more than 4,300 digits with a ``ValueError`` that nobody would catch, and no
    length a server accepts has more than 19.

    Raises:
        ProtocolError: anything else (a sign, spaces, "²", 5,000 digits).
    """
    if _LENGTH.fullmatch(text) is None:
        raise ProtocolError(f"{what} must be a non-negative integer of at most 19 digits")
    return int(text)


def check_datatype(datatype: Any, where: str) -> str:
    """A known datatype name, or :class:`ProtocolError`."""
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise ProtocolError(
            f"{where}: unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}"
        )
    return datatype


MAX_DIMENSIONS = 32  # NumPy's own limit is 64; no model here has more than a handful
MAX_ELEMENTS = 1 << 40


def check_shape(shape: Any, where: str) -> list[int]:
    """A shape given on the wire, validated: at most 32 non-negative integers, of a
    product NumPy can allocate."""
    if not isinstance(shape, (list, tuple)) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ProtocolError(
            f"{where}: shape must be a list of non-negative integers, got {_short(shape)}"
        )
    if len(shape) > MAX_DIMENSIONS:
        raise ProtocolError(f"{where}: {len(shape)} dimensions; at most {MAX_DIMENSIONS}")
    if any(d > MAX_ELEMENTS for d in shape) or (all(shape) and math.prod(shape) > MAX_ELEMENTS):
        raise ProtocolError(f"{where}: shape {_short(shape)} is too large")
    return list(shape)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def element_count(shape: list[int]) -> int:
    return math.prod(shape)


@functools.cache
def _wire_dtype(datatype: str) -> np.dtype[Any]:
    """The little-endian dtype a datatype travels in (one object per name: made once,
    not on every tensor of every request; bounded: only known names get here, an
    unknown one raises)."""
    dtype: np.dtype[Any] = numpy_dtype(datatype).newbyteorder("<")
    return dtype


def array_from_bytes(
    data: bytes | memoryview, datatype: str, shape: list[int], where: str
) -> Array:
    """A tensor from its raw little-endian bytes (``BYTES``: 4-byte length prefixes).

    Raises:
        ProtocolError: the byte count does not match the shape and datatype.
    """
    count = element_count(shape)
    if datatype == "BYTES":
        items: list[bytes] = []
        view = memoryview(data)
        offset = 0
        while offset < len(view):
            if offset + 4 > len(view):
                raise ProtocolError(f"{where}: truncated BYTES element length")
            length = int.from_bytes(view[offset : offset + 4], "little")
            offset += 4
            if offset + length > len(view):
                raise ProtocolError(f"{where}: BYTES element longer than the data")
            items.append(bytes(view[offset : offset + length]))
            offset += length
        if len(items) != count:
            raise ProtocolError(
                f"{where}: {len(items)} BYTES elements for shape {shape} ({count} expected)"
            )
        array = np.empty(count, dtype=object)
        array[:] = items
        return array.reshape(shape)
    dtype = _wire_dtype(datatype)
    expected = count * dtype.itemsize
    if len(data) != expected:
        raise ProtocolError(
            f"{where}: {len(data)} bytes of data for shape {shape} and datatype {datatype} "
            f"({expected} expected)"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def array_to_bytes(array: Array, datatype: str) -> bytes:
    """A tensor's raw little-endian bytes (``BYTES``: 4-byte length prefixes)."""
    if datatype == "BYTES":
        parts = []
        for item in array.ravel():
            raw = item if isinstance(item, bytes) else str(item).encode("utf-8")
            parts.append(len(raw).to_bytes(4, "little"))
            parts.append(raw)
        return b"".join(parts)
    return np.ascontiguousarray(array, dtype=_wire_dtype(datatype)).tobytes()
