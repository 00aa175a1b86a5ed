"""The Open Inference Protocol over gRPC: protobuf messages <-> protocol-neutral types.

The messages are the generated modules that ``tritonclient[grpc]`` ships
(``inference.GRPCInferenceService``). Using them, rather than compiling a
second copy of the same ``.proto``, keeps a stock ``tritonclient`` usable in
the same process (two copies of package ``inference`` clash in protobuf's
descriptor pool).

Tensors travel as ``raw_input_contents`` / ``raw_output_contents`` (what
``tritonclient`` sends and expects); typed ``contents`` fields are accepted
on input too.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from edge_core.errors import ProtocolError
from edge_core.protocol.types import (
    Array,
    InferRequest,
    InferResponse,
    RequestedOutput,
    array_from_bytes,
    array_to_bytes,
    check_datatype,
    check_shape,
    element_count,
)
from edge_core.tensors import datatype_of, numpy_dtype

__all__ = [
    "Malformed",
    "generic_handler",
    "pb",
    "request_from_proto",
    "request_to_proto",
    "response_from_proto",
    "response_to_proto",
]


@functools.cache
def pb() -> Any:
    """The generated ``service_pb2`` module (imported on first use; then the module
    itself, not an import statement's lookups, on each message)."""
    from tritonclient.grpc import service_pb2

    return service_pb2


_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameters_from_proto(params: Any) -> dict[str, Any]:
    if not params:  # most requests: no items to walk
        return {}
    out: dict[str, Any] = {}
    for key, value in params.items():
        kind = value.WhichOneof("parameter_choice")
        out[key] = getattr(value, kind) if kind else None
    return out


def parameters_to_proto(target: Any, params: dict[str, Any]) -> None:
    for key, value in params.items():
        slot = target[key]
        if isinstance(value, bool):
            slot.bool_param = value
        elif isinstance(value, int):
            slot.int64_param = value
        elif isinstance(value, float):
            slot.double_param = value
        else:
            slot.string_param = str(value)


def _typed_contents(tensor: Any, datatype: str, shape: list[int], where: str) -> Array:
    field = _CONTENTS.get(datatype)
    if field is None:
        raise ProtocolError(f"{where}: datatype {datatype} must be sent as raw_input_contents")
    values = getattr(tensor.contents, field)
    count = element_count(shape)
    if len(values) != count:
        raise ProtocolError(
            f"{where}: {len(values)} values in contents.{field} but shape {shape} needs {count}"
        )
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    dtype = numpy_dtype(datatype)
    raw = np.asarray(values)
    if raw.size and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if raw.min() < info.min or raw.max() > info.max:
            raise ProtocolError(f"{where}: a value is out of range for {datatype}")
    return raw.astype(dtype).reshape(shape)


def request_from_proto(message: Any) -> InferRequest:
    """A ``ModelInferRequest`` as an :class:`InferRequest` (server side).

    Raises:
        ProtocolError: the message is inconsistent (counts, sizes, datatypes).
    """
    if not message.inputs:
        raise ProtocolError("the request has no inputs")
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise ProtocolError(
            f"raw_input_contents has {len(raw)} entries for {len(message.inputs)} inputs"
        )
    inputs: dict[str, Array] = {}
    datatypes: dict[str, str] = {}
    for index, tensor in enumerate(message.inputs):
        if not tensor.name:
            raise ProtocolError(f"inputs[{index}] has no name")
        where = f"input {tensor.name!r}"
        if tensor.name in inputs:
            raise ProtocolError(f"{where} is given twice")
        datatype = check_datatype(tensor.datatype, where)
        shape = check_shape(list(tensor.shape), where)
        if raw:
            inputs[tensor.name] = array_from_bytes(raw[index], datatype, shape, where)
        else:
            inputs[tensor.name] = _typed_contents(tensor, datatype, shape, where)
        datatypes[tensor.name] = datatype
    outputs = [RequestedOutput(o.name) for o in message.outputs] or None
    return InferRequest(
        inputs=inputs,
        datatypes=datatypes,
        model_name=message.model_name,
        model_version=message.model_version,
        id=message.id,
        outputs=outputs,
        parameters=parameters_from_proto(message.parameters),
    )


def response_to_proto(response: InferResponse) -> Any:
    """An :class:`InferResponse` as a ``ModelInferResponse`` with raw output contents."""
    message = pb().ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    for name, array in response.outputs.items():
        datatype = datatype_of(array.dtype)
        message.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        message.raw_output_contents.append(array_to_bytes(array, datatype))
    parameters_to_proto(message.parameters, response.parameters)
    return message


def request_to_proto(request: InferRequest) -> Any:
    """An :class:`InferRequest` as a ``ModelInferRequest`` (client side)."""
    message = pb().ModelInferRequest(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    for name, array in request.inputs.items():
        datatype = request.datatypes.get(name) or datatype_of(array.dtype)
        message.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        message.raw_input_contents.append(array_to_bytes(array, datatype))
    for output in request.outputs or ():
        message.outputs.add(name=output.name)
    parameters_to_proto(message.parameters, request.parameters)
    return message


def response_from_proto(message: Any) -> InferResponse:
    """A ``ModelInferResponse`` as an :class:`InferResponse` (client side).

    Raises:
        ProtocolError: the message is inconsistent.
    """
    raw = message.raw_output_contents
    outputs: dict[str, Array] = {}
    for index, tensor in enumerate(message.outputs):
        where = f"output {tensor.name!r}"
        datatype = check_datatype(tensor.datatype, where)
        shape = check_shape(list(tensor.shape), where)
        if raw:
            if index >= len(raw):
                raise ProtocolError(f"{where} has no raw_output_contents entry")
            outputs[tensor.name] = array_from_bytes(raw[index], datatype, shape, where)
        else:
            outputs[tensor.name] = _typed_contents(tensor, datatype, shape, where)
    return InferResponse(
        model_name=message.model_name,
        model_version=message.model_version,
        outputs=outputs,
        id=message.id,
        parameters=parameters_from_proto(message.parameters),
    )


class Malformed:
    """What a request that is not valid protobuf becomes: the servicer answers it
    INVALID_ARGUMENT (gRPC's own default would be INTERNAL)."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _parser(message_class: Any) -> Any:
    from google.protobuf.message import DecodeError

    def parse(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except (DecodeError, ValueError) as exc:
            return Malformed(exc)

    return parse


def generic_handler(methods: dict[str, Any]) -> Any:
    """A ``grpc`` generic handler for ``inference.GRPCInferenceService``'s unary
    methods named in ``methods`` (name -> behaviour, sync or async).

    Like the generated ``add_GRPCInferenceServiceServicer_to_server``, except
    that requests are parsed by :class:`Malformed`-returning parsers (a behaviour
    must check for one). Methods not given are answered UNIMPLEMENTED by gRPC.
    """
    import grpc

    service = pb().DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers = {
        method.name: grpc.unary_unary_rpc_method_handler(
            methods[method.name],
            request_deserializer=_parser(getattr(pb(), method.input_type.name)),
            response_serializer=getattr(pb(), method.output_type.name).SerializeToString,
        )
        for method in service.methods
        if method.name in methods
    }
    return grpc.method_handlers_generic_handler(service.full_name, handlers)
