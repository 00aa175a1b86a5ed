"""The Open Inference Protocol over HTTP/REST: JSON and the binary tensor extension.

A body is a JSON header, optionally followed by raw tensor bytes; the
``Inference-Header-Content-Length`` header says where the JSON ends. An input
with ``"parameters": {"binary_data_size": N}`` takes its data from the next N
bytes after the header; an output is returned the same way when the request
asks (per output ``"binary_data": true``, or ``"binary_data_output": true``
for all), which is what stock ``tritonclient.http`` does by default.

Both directions are here: the server side (decode requests, encode
responses) and the client side (encode requests, decode responses).

Numbers are strict JSON (RFC 8259), which has no NaN or infinity:

- a request's JSON is refused (:class:`ProtocolError`, a 400) when it holds the
  tokens ``NaN``, ``Infinity`` or ``-Infinity`` (which Python's ``json`` would
  take), a number out of its datatype's range (``1e400``, or ``1e39`` for FP32,
  which would become infinity), or an integer of more than 4,300 digits;
- a response is never written with bare ``NaN`` tokens, which strict parsers
  reject: an output asked for as JSON that holds NaN or an infinity is refused
  with a message that says to ask for it as binary data, which carries every
  IEEE 754 value. Triton writes the tokens instead (and its clients read them),
  so a response *read* here (:func:`decode_infer_response`) may hold them;
- binary tensor data is taken as it is, NaN included, in both directions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from edge_core.errors import ProtocolError
from edge_core.protocol.types import (
    Array,
    InferRequest,
    InferResponse,
    RawAnswer,
    RawRequest,
    RequestedOutput,
    array_from_bytes,
    array_to_bytes,
    check_datatype,
    check_shape,
    element_count,
)
from edge_core.tensors import datatype_of, numpy_dtype

__all__ = [
    "HEADER_LENGTH",
    "decode_infer_request",
    "decode_infer_response",
    "encode_infer_request",
    "encode_infer_response",
    "forward_infer_request",
    "load_json",
]

HEADER_LENGTH = "Inference-Header-Content-Length"


def _split(
    body: bytes, header_length: int | None, *, finite: bool = True
) -> tuple[dict[str, Any], memoryview]:
    if header_length is not None:
        if header_length < 0 or header_length > len(body):
            raise ProtocolError(
                f"{HEADER_LENGTH} is {header_length} but the body has {len(body)} bytes"
            )
        header, rest = body[:header_length], memoryview(body)[header_length:]
    else:
        header, rest = body, memoryview(b"")
    document = load_json(header, "the request body", finite=finite)
    if not isinstance(document, dict):
        raise ProtocolError("the request body must be a JSON object")
    return document, rest


def _refuse_constant(token: str) -> Any:
    raise ProtocolError(f"{token} is not a JSON number (send non-finite values as binary data)")


def load_json(data: bytes | str, what: str, *, finite: bool = True) -> Any:
    """A JSON document a client sent; ``what`` names it in messages.

    ``finite``: refuse the ``NaN`` and ``Infinity`` tokens that are not JSON (a
    number too large for a float, such as ``1e400``, still reads as infinity:
    the tensor checks refuse it with its input's name).

    Raises:
        ProtocolError: not UTF-8 JSON, nested too deeply, an integer of more than
            4,300 digits, or (``finite``) a non-finite constant.
    """
    hooks: dict[str, Any] = {"parse_constant": _refuse_constant} if finite else {}
    try:
        return json.loads(data, **hooks)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError(f"{what} is nested too deeply") from None
    except ValueError:
        # the only other ValueError the decoder raises: Python's limit on int() of
        # long digit strings (4,300 digits); its message is advice for our own code
        raise ProtocolError(f"{what} holds an integer of more than 4300 digits") from None


def _parameters(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError(f"{where}: 'parameters' must be an object")
    return value


def _json_data(
    data: Any, datatype: str, shape: list[int], where: str, *, finite: bool = True
) -> Array:
    count = element_count(shape)
    if datatype == "BYTES":
        flat = np.asarray(data, dtype=object).ravel()
        items = [v.encode("utf-8") if isinstance(v, str) else v for v in flat]
        if not all(isinstance(v, bytes) for v in items):
            raise ProtocolError(f"{where}: BYTES data must be strings")
        array = np.empty(len(items), dtype=object)
        array[:] = items
    else:
        dtype = numpy_dtype(datatype)
        try:
            raw = np.asarray(data)
        except ValueError:
            raise ProtocolError(f"{where}: 'data' is not a regular array") from None
        if raw.size == 0:
            raw = raw.astype(dtype)
        if raw.dtype.kind not in "biuf" or (raw.dtype.kind == "f" and dtype.kind in "biu"):
            raise ProtocolError(
                f"{where}: 'data' holds {_kind(raw)} values, which datatype {datatype} cannot take"
            )
        if raw.dtype.kind in "iu" and dtype.kind in "iu":
            info = np.iinfo(dtype)
            if raw.size and (raw.min() < info.min or raw.max() > info.max):
                raise ProtocolError(f"{where}: a value is out of range for {datatype}")
        # a float too large for the datatype becomes infinity: refused below, not warned about
        with np.errstate(over="ignore"):
            array = raw.astype(dtype).ravel()
        if finite and dtype.kind == "f" and not np.isfinite(array).all():
            raise ProtocolError(
                f"{where}: a value is out of range for {datatype} (JSON numbers must be finite; "
                "send NaN or infinity as binary data)"
            )
    if array.size != count:
        raise ProtocolError(
            f"{where}: 'data' has {array.size} elements but shape {shape} needs {count}"
        )
    return array.reshape(shape)


def _kind(array: Array) -> str:
    return {"f": "floating-point", "U": "string", "O": "mixed", "b": "boolean"}.get(
        array.dtype.kind, str(array.dtype)
    )


def decode_infer_request(
    body: bytes, header_length: int | None = None, *, keep_raw: bool = False
) -> InferRequest:
    """Parse an infer request body (server side). ``keep_raw``: when every input is
    binary data, keep the body as it came too (:attr:`InferRequest.raw`).

    Raises:
        ProtocolError: the body is malformed; the message says where and how.
    """
    document, binary = _split(body, header_length)
    raw_inputs = document.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise ProtocolError("'inputs' must be a non-empty list")
    inputs: dict[str, Array] = {}
    datatypes: dict[str, str] = {}
    sizes: list[int] | None = [] if keep_raw else None  # each input's bytes, while all binary
    offset = 0
    for index, item in enumerate(raw_inputs):
        name, datatype, array, size = _decode_input(item, index, inputs, binary, offset)
        inputs[name], datatypes[name] = array, datatype
        if size is None:
            sizes = None  # an input in JSON: the request is not kept
        else:
            offset += size
            if sizes is not None:
                sizes.append(size)
    if offset != len(binary):
        raise ProtocolError(
            f"the body has {len(binary) - offset} bytes of binary data that no input claims"
        )
    raw = None if sizes is None else RawRequest(tuple(sizes), binary)
    return _infer_request(document, inputs, datatypes, raw)


def _decode_input(
    item: Any, index: int, seen: dict[str, Array], binary: memoryview, offset: int
) -> tuple[str, str, Array, int | None]:
    """Entry ``index`` of a request's ``inputs``: its name, datatype and array, and the
    bytes of binary data it took from ``offset`` on (``None``: it came as JSON)."""
    where = f"inputs[{index}]"
    if not isinstance(item, dict):
        raise ProtocolError(f"{where} must be an object")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"{where}: 'name' must be a non-empty string")
    where = f"input {name!r}"
    if name in seen:
        raise ProtocolError(f"{where} is given twice")
    datatype, shape, size = _tensor_fields(item, where)
    if size is not None:
        if offset + size > len(binary):
            raise ProtocolError(
                f"{where}: binary_data_size {size} goes past the end of the body "
                f"({len(binary) - offset} bytes left)"
            )
        array = array_from_bytes(binary[offset : offset + size], datatype, shape, where)
        return name, datatype, array, size
    if "data" in item:
        return name, datatype, _json_data(item["data"], datatype, shape, where), None
    raise ProtocolError(f"{where} has neither 'data' nor 'binary_data_size'")


def _tensor_fields(item: dict[str, Any], where: str) -> tuple[str, list[int], int | None]:
    """A tensor entry's datatype, shape and ``binary_data_size`` (``None``: its data is
    JSON), each checked."""
    datatype = check_datatype(item.get("datatype"), where)
    shape = check_shape(item.get("shape"), where)
    size = _parameters(item.get("parameters"), where).get("binary_data_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise ProtocolError(f"{where}: 'binary_data_size' must be a non-negative integer")
    return datatype, shape, size


def _infer_request(
    document: dict[str, Any],
    inputs: dict[str, Array],
    datatypes: dict[str, str],
    raw: RawRequest | None,
) -> InferRequest:
    """The request of ``document``'s outputs, parameters and id around its inputs."""
    outputs = _requested_outputs(document.get("outputs"))
    parameters = _parameters(document.get("parameters"), "request")
    request_id = document.get("id", "")
    if not isinstance(request_id, str):
        raise ProtocolError("'id' must be a string")
    binary_output = parameters.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise ProtocolError("parameter 'binary_data_output' must be true or false")
    request = InferRequest(
        inputs=inputs,
        datatypes=datatypes,
        id=request_id,
        outputs=outputs,
        parameters=parameters,
        binary_output=binary_output,
        raw=raw,
    )
    _ = request.timeout_us  # validated here, used by the data plane
    return request


def _requested_outputs(value: Any) -> list[RequestedOutput] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ProtocolError("'outputs' must be a list")
    outputs = []
    for index, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ProtocolError(f"outputs[{index}] must be an object with a string 'name'")
        parameters = _parameters(item.get("parameters"), f"output {item['name']!r}")
        if "classification" in parameters:
            raise ProtocolError(
                f"output {item['name']!r}: the classification extension is not supported"
            )
        binary = parameters.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise ProtocolError(f"output {item['name']!r}: 'binary_data' must be true or false")
        outputs.append(RequestedOutput(item["name"], binary))
    return outputs


def _json_values(array: Array, datatype: str, where: str) -> list[Any]:
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise ProtocolError(
            f"{where} holds NaN or infinity, which JSON cannot carry: ask for it as binary data "
            '(its "binary_data" parameter, or "binary_data_output" for every output)'
        )
    if datatype == "BYTES":
        return [
            v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
            for v in array.ravel()
        ]
    flat: list[Any] = array.ravel().tolist()
    return flat


def _tensors(
    arrays: dict[str, Array], datatypes: dict[str, str], binary: Callable[[str], bool], kind: str
) -> tuple[list[dict[str, Any]], list[bytes]]:
    """The body's tensor entries, and the binary data that follows the JSON header."""
    entries = []
    blobs = []
    for name, array in arrays.items():
        datatype = datatypes.get(name) or datatype_of(array.dtype)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if binary(name):
            blob = array_to_bytes(array, datatype)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = _json_values(array, datatype, f"{kind} {name!r}")
        entries.append(entry)
    return entries, blobs


def encode_infer_response(
    response: InferResponse, request: InferRequest
) -> tuple[bytes, int | None]:
    """The response body and the JSON header's length (``None``: the body is plain JSON).

    Raises:
        ProtocolError: an output asked for as JSON holds NaN or infinity.
    """
    binary_names: set[str] = set()
    if request.outputs is None:
        if request.binary_output:
            binary_names = set(response.outputs)
    else:
        binary_names = {
            o.name
            for o in request.outputs
            if (o.binary_data if o.binary_data is not None else request.binary_output)
        }
    raw = response.raw
    if raw is not None and raw.binary == binary_names == response.outputs.keys():
        return raw.body, raw.header_length  # an engine's answer in the form asked: as it is
    entries, blobs = _tensors(response.outputs, {}, lambda name: name in binary_names, "output")
    document: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "outputs": entries,
    }
    if response.id:
        document["id"] = response.id
    if response.parameters:
        document["parameters"] = response.parameters
    header = json.dumps(document, separators=(",", ":")).encode()
    if not blobs:
        return header, None
    return header + b"".join(blobs), len(header)


def encode_infer_request(request: InferRequest, *, binary: bool = True) -> tuple[bytes, int | None]:
    """An infer request body (client side); tensors as binary data unless ``binary`` is off.

    Raises:
        ProtocolError: ``binary`` is off and an input holds NaN or infinity.
    """
    entries, blobs = _tensors(request.inputs, request.datatypes, lambda name: binary, "input")
    document: dict[str, Any] = {"inputs": entries}
    if request.id:
        document["id"] = request.id
    parameters = dict(request.parameters)
    if request.outputs is not None:
        document["outputs"] = [
            {"name": o.name, "parameters": {"binary_data": bool(o.binary_data)}}
            for o in request.outputs
        ]
    elif binary:
        parameters["binary_data_output"] = True
    if parameters:
        document["parameters"] = parameters
    header = json.dumps(document, separators=(",", ":")).encode()
    if not blobs:
        return header, None
    return header + b"".join(blobs), len(header)


def forward_infer_request(
    request: InferRequest, parameters: dict[str, Any]
) -> tuple[tuple[bytes | memoryview, ...], int]:
    """A request kept as it came (:attr:`InferRequest.raw`), to be sent on with
    ``parameters``: the parts of the body, and the JSON header's length. Only the
    header is written again, from what was checked (each input's name, datatype,
    shape and byte count, the outputs asked for, the id), every output asked for as
    binary data; the tensor bytes go as they came.

    Raises:
        ValueError: ``request`` was not kept.
    """
    raw = request.raw
    if raw is None:
        raise ValueError("a request decoded without keep_raw")
    inputs = [
        {
            "name": name,
            "datatype": request.datatypes[name],
            "shape": list(array.shape),
            "parameters": {"binary_data_size": size},
        }
        for (name, array), size in zip(request.inputs.items(), raw.sizes, strict=True)
    ]
    document: dict[str, Any] = {"inputs": inputs}
    if request.id:
        document["id"] = request.id
    parameters = dict(parameters)
    if request.outputs is not None:
        document["outputs"] = [
            {"name": o.name, "parameters": {"binary_data": True}} for o in request.outputs
        ]
    else:
        parameters["binary_data_output"] = True
    document["parameters"] = parameters
    header = json.dumps(document, separators=(",", ":")).encode()
    return (header, raw.binary), len(header)


_ANSWER_KEYS = frozenset({"model_name", "model_version", "id", "outputs"})
_OUTPUT_KEYS = frozenset({"name", "datatype", "shape", "parameters"})


def _plain(document: dict[str, Any]) -> bool:
    """An answer's top level holds only what this module's own answers hold, as strings."""
    return set(document) <= _ANSWER_KEYS and all(
        isinstance(document.get(key, ""), str) for key in ("model_name", "model_version", "id")
    )


def decode_infer_response(
    body: bytes, header_length: int | None = None, *, keep_raw: bool = False
) -> InferResponse:
    """Parse an infer response body (client side). ``keep_raw``: when every output is
    binary data, keep the body too (:attr:`InferResponse.raw`), to be relayed.

    Raises:
        ProtocolError: the body is malformed.
    """
    # what Triton writes: NaN and Infinity tokens in JSON outputs
    document, binary = _split(body, header_length, finite=False)
    raw_outputs = document.get("outputs")
    if not isinstance(raw_outputs, list):
        raise ProtocolError("the response has no 'outputs' list")
    outputs: dict[str, Array] = {}
    offset = 0
    # relayed only when it holds nothing the gateway would not write itself
    binary_names: set[str] | None = set() if keep_raw and _plain(document) else None
    for index, item in enumerate(raw_outputs):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ProtocolError(f"outputs[{index}] must be an object with a string 'name'")
        where = f"output {item['name']!r}"
        datatype, shape, size = _tensor_fields(item, where)
        if size is not None:
            outputs[item["name"]] = array_from_bytes(
                binary[offset : offset + size], datatype, shape, where
            )
            offset += size
        else:
            outputs[item["name"]] = _json_data(
                item.get("data"), datatype, shape, where, finite=False
            )
            binary_names = None  # a JSON output: never relayed (it may hold NaN tokens)
        if binary_names is not None:
            plain = set(item) <= _OUTPUT_KEYS and item.get("parameters") == {
                "binary_data_size": size
            }
            if not plain or item["name"] in binary_names:
                binary_names = None
            else:
                binary_names.add(item["name"])
    if offset != len(binary):
        binary_names = None  # bytes that no output claims: read, never passed on
    return InferResponse(
        model_name=str(document.get("model_name", "")),
        model_version=str(document.get("model_version", "")),
        outputs=outputs,
        id=str(document.get("id", "")),
        parameters=_parameters(document.get("parameters"), "response"),
        raw=None
        if binary_names is None
        else RawAnswer(body, header_length, frozenset(binary_names)),
    )
