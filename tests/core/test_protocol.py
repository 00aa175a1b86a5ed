"""The Open Inference Protocol codecs (REST JSON + binary, gRPC protobuf), without servers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from edge_core.errors import ProtocolError
from edge_core.protocol.grpc import (
    pb,
    request_from_proto,
    request_to_proto,
    response_from_proto,
    response_to_proto,
)
from edge_core.protocol.rest import (
    decode_infer_request,
    decode_infer_response,
    encode_infer_request,
    encode_infer_response,
    forward_infer_request,
)
from edge_core.protocol.types import InferRequest, InferResponse, RequestedOutput


def sample_request() -> InferRequest:
    return InferRequest(
        inputs={
            "pixels": np.arange(12, dtype=np.float32).reshape(2, 6),
            "mask": np.array([[1, 0], [0, 1]], dtype=np.uint8),
            "text": np.array([b"hello", "wörld".encode()], dtype=object),
        },
        datatypes={"pixels": "FP32", "mask": "UINT8", "text": "BYTES"},
        id="req-1",
        parameters={"timeout": 5000},
    )


@pytest.mark.parametrize("binary", [True, False])
def test_rest_request_round_trip(binary: bool) -> None:
    request = sample_request()
    body, header = encode_infer_request(request, binary=binary)
    assert (header is not None) == binary
    decoded = decode_infer_request(body, header)
    assert decoded.id == "req-1" and decoded.timeout_us == 5000
    assert decoded.datatypes == request.datatypes
    for name, array in request.inputs.items():
        assert decoded.inputs[name].shape == array.shape
        assert list(decoded.inputs[name].ravel()) == list(array.ravel())
    assert decoded.binary_output == binary


def test_rest_nested_json_data_is_accepted() -> None:
    body = json.dumps(
        {"inputs": [{"name": "x", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 4]]}]}
    ).encode()
    assert decode_infer_request(body).inputs["x"].tolist() == [[1, 2], [3, 4]]


def test_rest_response_binary_only_where_asked() -> None:
    response = InferResponse(
        "m", "1", {"a": np.ones((1, 3), np.float32), "b": np.zeros((2,), np.int64)}, id="r"
    )
    request = InferRequest(
        inputs={}, datatypes={}, outputs=[RequestedOutput("a", True), RequestedOutput("b", False)]
    )
    body, header = encode_infer_response(response, request)
    assert header is not None
    document = json.loads(body[:header])
    assert document["outputs"][0]["parameters"] == {"binary_data_size": 12}
    assert document["outputs"][1]["data"] == [0, 0]
    decoded = decode_infer_response(body, header)
    assert decoded.outputs["a"].tolist() == [[1.0, 1.0, 1.0]]
    assert decoded.outputs["b"].dtype == np.int64


def test_rest_response_all_binary_with_binary_data_output() -> None:
    response = InferResponse("m", "1", {"a": np.ones((2, 2), np.float16)})
    request = InferRequest(inputs={}, datatypes={}, binary_output=True)
    body, header = encode_infer_response(response, request)
    decoded = decode_infer_response(body, header)
    assert decoded.outputs["a"].dtype == np.float16 and decoded.outputs["a"].sum() == 4


def bad(document: object, binary: bytes = b"", header: int | None = None) -> str:
    head = json.dumps(document).encode() if not isinstance(document, bytes) else document
    if binary:
        header = len(head)
    with pytest.raises(ProtocolError) as info:
        decode_infer_request(head + binary, header)
    return str(info.value)


def tensor(**fields: object) -> dict[str, object]:
    return {"name": "x", "datatype": "FP32", "shape": [2], **fields}


def test_rest_malformed_requests_say_what_is_wrong() -> None:
    assert "not valid JSON" in bad(b"{nope")
    assert "must be a JSON object" in bad([1, 2])
    assert "'inputs' must be a non-empty list" in bad({"inputs": []})
    assert "unknown datatype 'FLOAT32'" in bad(
        {"inputs": [tensor(datatype="FLOAT32", data=[1, 2])]}
    )
    assert "shape must be a list of non-negative integers" in bad(
        {"inputs": [tensor(shape=[-1], data=[1])]}
    )
    assert "'data' has 3 elements but shape [2] needs 2" in bad(
        {"inputs": [tensor(data=[1, 2, 3])]}
    )
    assert "neither 'data' nor 'binary_data_size'" in bad({"inputs": [tensor()]})
    assert "holds string values" in bad({"inputs": [tensor(data=["a", "b"])]})
    assert "floating-point values, which datatype INT8 cannot take" in bad(
        {"inputs": [tensor(datatype="INT8", data=[1.5, 2])]}
    )
    assert "out of range for UINT8" in bad({"inputs": [tensor(datatype="UINT8", data=[1, 300])]})
    assert "is given twice" in bad({"inputs": [tensor(data=[1, 2]), tensor(data=[1, 2])]})
    assert "'timeout' must be a non-negative integer" in bad(
        {"inputs": [tensor(data=[1, 2])], "parameters": {"timeout": "soon"}}
    )
    assert "classification extension is not supported" in bad(
        {
            "inputs": [tensor(data=[1, 2])],
            "outputs": [{"name": "y", "parameters": {"classification": 3}}],
        }
    )


def test_rest_binary_data_must_add_up() -> None:
    sized = {"inputs": [tensor(parameters={"binary_data_size": 8})]}
    assert "goes past the end of the body" in bad(sized, b"\x00" * 4)
    assert "4 bytes of binary data that no input claims" in bad(sized, b"\x00" * 12)
    odd = {"inputs": [tensor(parameters={"binary_data_size": 6})]}
    assert "6 bytes of data for shape [2] and datatype FP32 (8 expected)" in bad(odd, b"\x00" * 6)
    with pytest.raises(ProtocolError, match="Inference-Header-Content-Length is 99"):
        decode_infer_request(b"{}", 99)


def test_grpc_round_trip_with_raw_contents() -> None:
    request = sample_request()
    request.model_name = "m"
    request.outputs = [RequestedOutput("y")]
    message = request_to_proto(request)
    assert len(message.raw_input_contents) == 3
    decoded = request_from_proto(pb().ModelInferRequest.FromString(message.SerializeToString()))
    assert decoded.model_name == "m" and decoded.parameters == {"timeout": 5000}
    assert [o.name for o in decoded.outputs or []] == ["y"]
    assert decoded.inputs["text"].tolist() == [b"hello", "wörld".encode()]
    response = InferResponse("m", "1", {"y": np.arange(6, dtype=np.int32).reshape(3, 2)}, id="r")
    back = response_from_proto(response_to_proto(response))
    assert back.outputs["y"].tolist() == [[0, 1], [2, 3], [4, 5]] and back.id == "r"


def test_grpc_typed_contents_are_accepted() -> None:
    message = pb().ModelInferRequest(model_name="m")
    tensor_message = message.inputs.add(name="x", datatype="FP32", shape=[2, 2])
    tensor_message.contents.fp32_contents.extend([1, 2, 3, 4])
    assert request_from_proto(message).inputs["x"].tolist() == [[1, 2], [3, 4]]


def test_grpc_inconsistent_messages_are_refused() -> None:
    message = pb().ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="FP32", shape=[2])
    message.inputs.add(name="y", datatype="FP32", shape=[2])
    message.raw_input_contents.append(b"\x00" * 8)
    with pytest.raises(ProtocolError, match="raw_input_contents has 1 entries for 2 inputs"):
        request_from_proto(message)
    with pytest.raises(ProtocolError, match="the request has no inputs"):
        request_from_proto(pb().ModelInferRequest(model_name="m"))
    odd = pb().ModelInferRequest(model_name="m")
    odd.inputs.add(name="x", datatype="FP32", shape=[3])
    odd.raw_input_contents.append(b"\x00" * 8)
    with pytest.raises(
        ProtocolError, match=r"8 bytes of data for shape \[3\] and datatype FP32 \(12 expected\)"
    ):
        request_from_proto(odd)
    typed = pb().ModelInferRequest(model_name="m")
    typed.inputs.add(name="x", datatype="FP16", shape=[1])
    with pytest.raises(ProtocolError, match="FP16 must be sent as raw_input_contents"):
        request_from_proto(typed)


def test_rest_numbers_are_strict_json() -> None:
    """No NaN or infinity, no integer Python refuses to convert (issue 11)."""
    for token in ("NaN", "Infinity", "-Infinity"):
        text = '{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [%s, 1]}]}'
        assert f"{token} is not a JSON number" in bad((text % token).encode())
    assert "out of range for FP32" in bad({"inputs": [tensor(data=[1e39, 1])]})
    assert "out of range for FP16" in bad({"inputs": [tensor(datatype="FP16", data=[7e4, 1])]})
    huge = b'{"inputs": [], "id": ' + b"9" * 5000 + b"}"
    assert "an integer of more than 4300 digits" in bad(huge)
    assert "must be a non-negative integer (microseconds)" in bad(
        {"inputs": [tensor(data=[1, 2])], "parameters": {"timeout": 10**400}}
    )


def test_rest_non_finite_outputs_are_binary_or_refused() -> None:
    nan = np.array([np.nan, np.inf], dtype=np.float32)
    response = InferResponse("m", "1", {"y": nan})
    as_json = InferRequest({}, {}, outputs=[RequestedOutput("y", binary_data=False)])
    with pytest.raises(ProtocolError, match="output 'y' holds NaN or infinity"):
        encode_infer_response(response, as_json)
    body, header = encode_infer_response(response, InferRequest({}, {}, binary_output=True))
    back = decode_infer_response(body, header).outputs["y"]
    assert np.isnan(back[0]) and np.isinf(back[1])
    # what Triton writes (bare tokens) is read on the client side
    triton = b'{"outputs": [{"name": "y", "datatype": "FP32", "shape": [2], "data": [NaN, 1]}]}'
    assert np.isnan(decode_infer_response(triton).outputs["y"][0])


def test_lengths_sent_as_text_are_bounded() -> None:
    from edge_core.protocol.types import parse_length

    assert parse_length("0", "n") == 0 and parse_length("9" * 19, "n") == 10**19 - 1
    for text in ("", "-1", " 1", "²", "1e3", "9" * 20, "1" * 5000):
        with pytest.raises(ProtocolError, match="n must be a non-negative integer"):
            parse_length(text, "n")


def test_numbers_from_clients_are_checked_for_type_and_range_before_use() -> None:
    from edge_core.errors import BadRequest
    from edge_core.numbers import MAX_INTEGER, integer, number

    assert integer(0, "n") == 0 and integer(MAX_INTEGER, "n") == 2**63 - 1
    assert (
        integer("0042", "n", text=True) == 42 and integer("9" * 19, "n", 0, 10**19, text=True) > 0
    )
    for value in (2**63, -1, 10**400, True, 1.0, "1", None, [1]):
        with pytest.raises(
            BadRequest, match=r"^n must be an integer from 0 to 9223372036854775807$"
        ):
            integer(value, "n")
    for text in ("", "²", "٣", " 1", "+1", "1_0", "0x10", "1e3", "1" * 20, "1" * 5000):
        with pytest.raises(BadRequest, match="in at most 19 ASCII digits"):
            integer(text, "n", text=True)
    assert number(10**2, "x", 0, 100) == 100.0 and number("12.5", "x", 0, 100, text=True) == 12.5
    for value in (10**400, -(10**400), math.inf, math.nan, 1e308, True, "5", None):
        with pytest.raises(BadRequest, match=r"^x must be a number from -1 to 100$"):
            number(value, "x", -1, 100)
    for text in ("٣", "²", "1e1", "-1", ".5", "5.", "1.2.3", "nan", "inf", "1" * 401):
        with pytest.raises(BadRequest, match="ASCII digits"):
            number(text, "x", -1, 100, text=True)


# -- passing a request through, and relaying an answer -------------------------------------


def test_a_binary_request_is_kept_as_it_came_only_when_asked() -> None:
    body, length = encode_infer_request(sample_request())
    assert decode_infer_request(body, length).raw is None
    raw = decode_infer_request(body, length, keep_raw=True).raw
    assert raw is not None and bytes(raw.binary) == body[length:]
    # an input in JSON: not kept (an engine would read JSON where binary was meant)
    json_body, _ = encode_infer_request(sample_request(), binary=False)
    assert decode_infer_request(json_body, None, keep_raw=True).raw is None
    # nor one whose binary_data_size is null (read from its data, as JSON)
    document = json.loads(json_body)
    document["inputs"][0]["parameters"] = {"binary_data_size": None}
    assert decode_infer_request(json.dumps(document).encode(), None, keep_raw=True).raw is None


def test_a_kept_request_goes_on_with_its_bytes_and_only_what_was_checked() -> None:
    request = sample_request()
    request.outputs = [RequestedOutput("scores", binary_data=False)]
    body, length = encode_infer_request(request)
    document = json.loads(body[:length])
    document["extra"] = "not part of the protocol"
    # what the gateway never checked does not reach the engine (Triton would read it)
    document["inputs"][0]["parameters"]["shared_memory_region"] = "someone-else's"
    document["outputs"][0]["parameters"]["shared_memory_region"] = "someone-else's"
    header = json.dumps(document).encode()
    kept = decode_infer_request(header + body[length:], len(header), keep_raw=True)
    parts, header_length = forward_infer_request(kept, {"timeout": 900})
    sent = b"".join(parts)
    assert sent[header_length:] == body[length:]  # the tensor bytes, untouched
    assert b"shared_memory" not in sent[:header_length] and b"extra" not in sent
    again = decode_infer_request(sent, header_length)
    assert again.parameters == {"timeout": 900}  # the caller's, not the device's 5000
    assert again.id == "req-1"
    # the engine is asked for binary outputs whatever the device wants: the gateway
    # encodes JSON itself, and relays only what is in the form asked
    assert [(o.name, o.binary_data) for o in again.outputs or []] == [("scores", True)]
    for name, array in request.inputs.items():
        np.testing.assert_array_equal(again.inputs[name], array)
    request.outputs = None
    body, length = encode_infer_request(request)
    parts, header_length = forward_infer_request(
        decode_infer_request(body, length, keep_raw=True), {}
    )
    assert decode_infer_request(b"".join(parts), header_length).binary_output is True
    with pytest.raises(ValueError, match="keep_raw"):
        forward_infer_request(decode_infer_request(body, length), {})


def answer(binary: bool) -> tuple[bytes, int | None]:
    response = InferResponse("m", "1", {"scores": np.array([[0.5, 1.5]], np.float32)}, id="req-1")
    return encode_infer_response(
        response, InferRequest({}, {}, outputs=[RequestedOutput("scores", binary)])
    )


def test_an_engines_binary_answer_is_relayed_in_the_form_asked() -> None:
    body, length = answer(binary=True)
    response = decode_infer_response(body, length, keep_raw=True)
    assert response.raw is not None and response.raw.binary == {"scores"}
    as_binary = InferRequest({}, {}, outputs=[RequestedOutput("scores", True)])
    assert encode_infer_response(response, as_binary) == (body, length)
    # the device asked for JSON: encoded again, not relayed
    as_json = InferRequest({}, {}, outputs=[RequestedOutput("scores", False)])
    again, again_length = encode_infer_response(response, as_json)
    assert again_length is None and json.loads(again)["outputs"][0]["data"] == [0.5, 1.5]


def test_only_whole_binary_answers_are_kept_for_relaying() -> None:
    json_body, _ = answer(binary=False)
    assert decode_infer_response(json_body, None, keep_raw=True).raw is None
    body, length = answer(binary=True)
    assert decode_infer_response(body, length).raw is None  # not asked
    # bytes that no output claims: read, never passed on
    assert decode_infer_response(body + b"\0" * 4, length, keep_raw=True).raw is None
    document = json.loads(body[:length])
    document["outputs"][0]["parameters"]["binary_data_size"] = "8"
    header = json.dumps(document).encode()
    with pytest.raises(ProtocolError, match="binary_data_size"):
        decode_infer_response(header + body[length:], len(header), keep_raw=True)


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.update(parameters={"sequence_id": 7}),  # what the gateway would drop
        lambda d: d.update(id=17),  # an id that is not a string
        lambda d: d["outputs"][0].update(data=[1, 2]),  # more than the binary entry
        lambda d: d["outputs"].append(dict(d["outputs"][0])),  # the same output twice
    ],
)
def test_an_answer_with_more_than_the_gateway_would_write_is_not_relayed(change) -> None:  # type: ignore[no-untyped-def]
    body, length = answer(binary=True)
    assert length is not None
    document = json.loads(body[:length])
    change(document)
    header = json.dumps(document).encode()
    blob = body[length:] * len(document["outputs"])
    assert decode_infer_response(header + blob, len(header), keep_raw=True).raw is None
