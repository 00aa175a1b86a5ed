"""What a device's offload sends besides tensors, answered by a real gateway to stock
tritonclient clients: pictures as image files (made the model's tensor from its
manifest), packed tensors both ways, the time spent, and the index a device may read."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from PIL import Image
from skimage import data
from tritonclient.utils import InferenceServerException

from edge_core.pictures import picture_to_tensor
from edge_core.protocol import packed
from edge_core.repository import ModelRepository
from tests.support.gateway import GatewayHandle, start_gateway
from tests.support.gateway_calls import http_request, ocr_repository

OUTPUT = "sigmoid_0.tmp_0"


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, fetched: ModelRepository
) -> Iterator[GatewayHandle]:
    tmp = tmp_path_factory.mktemp("pictures")
    repository = ocr_repository(tmp, fetched)
    handle = start_gateway(tmp, repository, poll_interval_s=0.0, max_body_bytes=16 * 1024 * 1024)
    yield handle
    handle.thread.stop()


def jpeg(picture: np.ndarray, size: tuple[int, int] = (320, 256)) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(picture).resize(size).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def files(*blobs: bytes) -> np.ndarray:
    out = np.empty(len(blobs), dtype=object)
    out[:] = list(blobs)
    return out


def expected(fetched: ModelRepository, blob: bytes) -> np.ndarray:
    """The tensor the device would have made of the picture itself, run on the gateway."""
    pre = fetched.get("ppocr-det").preprocessing
    assert pre is not None
    return picture_to_tensor(blob, pre)[0]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_picture_sent_as_a_file_is_answered_as_its_tensor(
    gateway: GatewayHandle, fetched: ModelRepository, protocol: str
) -> None:
    blob = jpeg(data.astronaut())
    tensor = expected(fetched, blob)
    assert tensor.shape == (1, 3, 256, 320)
    module: Any = thttp if protocol == "http" else tgrpc
    client = module.InferenceServerClient(
        gateway.http_url if protocol == "http" else gateway.grpc_url
    )

    def infer(name: str, value: np.ndarray, datatype: str) -> np.ndarray:
        tensor_input = module.InferInput(name, list(value.shape), datatype)
        tensor_input.set_data_from_numpy(value)
        result = client.infer("ppocr-det", [tensor_input], headers=gateway.headers())
        return result.as_numpy(OUTPUT)

    from_file = infer("x", files(blob), "BYTES")
    from_tensor = infer("x", tensor, "FP32")
    assert from_file.shape == (1, 1, 256, 320)
    assert np.allclose(from_file, from_tensor, atol=1e-5)
    # two pictures of one size, one request: one row each
    assert infer("x", files(blob, blob), "BYTES").shape == (2, 1, 256, 320)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (files(b"not a picture at all, just bytes"), "element 0 is not an image file"),
        (files(jpeg(data.astronaut()), jpeg(data.coffee(), (320, 224))), "different sizes"),
        (files(*[jpeg(data.camera())] * 33), "33 pictures, at most 32 a request"),
        (files(b"\xff\xd8\xff\xe0" + b"\x00" * 200), "cannot"),
    ],
)
def test_a_bad_picture_is_a_400_that_says_why(
    gateway: GatewayHandle, value: np.ndarray, message: str
) -> None:
    client = thttp.InferenceServerClient(gateway.http_url)
    tensor_input = thttp.InferInput("x", list(value.shape), "BYTES")
    tensor_input.set_data_from_numpy(value)
    with pytest.raises(InferenceServerException, match=message) as info:
        client.infer("ppocr-det", [tensor_input], headers=gateway.headers())
    assert info.value.status() == "400"


def test_packed_tensors_go_both_ways_when_asked(
    gateway: GatewayHandle, fetched: ModelRepository
) -> None:
    tensor = expected(fetched, jpeg(data.coffee()))
    # a zero border compresses; the request asks for its answer packed
    padded = np.zeros((1, 3, 512, 640), np.float32)
    padded[:, :, : tensor.shape[2], : tensor.shape[3]] = tensor
    plain_client = tgrpc.InferenceServerClient(gateway.grpc_url)
    plain_input = tgrpc.InferInput("x", list(padded.shape), "FP32")
    plain_input.set_data_from_numpy(padded)
    plain_map = plain_client.infer("ppocr-det", [plain_input], headers=gateway.headers()).as_numpy(
        OUTPUT
    )
    arrays, datatypes, descriptor = packed.pack({"x": padded})
    assert descriptor is not None and datatypes["x"] == "BYTES"
    client = thttp.InferenceServerClient(gateway.http_url)
    tensor_input = thttp.InferInput("x", [1], "BYTES")
    tensor_input.set_data_from_numpy(arrays["x"])
    result = client.infer(
        "ppocr-det",
        [tensor_input],
        headers=gateway.headers(),
        parameters={packed.PARAMETER: descriptor, packed.ASK: True, "edge_server_time": True},
    )
    response = result.get_response()
    parameters = response["parameters"]
    assert isinstance(parameters["edge_server_us"], int) and parameters["edge_server_us"] > 0
    (output,) = response["outputs"]
    assert output["datatype"] == "BYTES"
    outputs, _ = packed.unpack(
        {OUTPUT: result.as_numpy(OUTPUT)},
        {OUTPUT: "BYTES"},
        parameters[packed.PARAMETER],
        max_bytes=10**8,
    )
    answer = outputs[OUTPUT]
    assert answer.shape == (1, 1, 512, 640) and answer.dtype == np.float32
    assert np.array_equal(answer, plain_map)  # packed exactly


def test_outputs_asked_for_as_json_are_never_packed(gateway: GatewayHandle) -> None:
    """A packed stream is no JSON value: only outputs sent as binary data are packed."""
    client = thttp.InferenceServerClient(gateway.http_url)
    zeros = np.zeros((1, 3, 256, 256), np.float32)
    tensor_input = thttp.InferInput("x", list(zeros.shape), "FP32")
    tensor_input.set_data_from_numpy(zeros)
    as_json = thttp.InferRequestedOutput(OUTPUT, binary_data=False)
    result = client.infer(
        "ppocr-det",
        [tensor_input],
        outputs=[as_json],
        headers=gateway.headers(),
        parameters={packed.ASK: True},
    )
    response = result.get_response()
    assert packed.PARAMETER not in response.get("parameters", {})
    assert result.as_numpy(OUTPUT).shape == (1, 1, 256, 256)


def test_a_malformed_or_oversized_packed_tensor_is_refused(gateway: GatewayHandle) -> None:
    client = thttp.InferenceServerClient(gateway.http_url)
    element = files(b"\x78\x01" + bytes(30))
    tensor_input = thttp.InferInput("x", [1], "BYTES")
    tensor_input.set_data_from_numpy(element)
    for descriptor, status, message in (
        (json.dumps({"x": ["FP32", [1, 3, 32, 32]]}), "400", "not a zlib stream|does not inflate"),
        (json.dumps({"x": ["FP32", [1, 3, 4096, 4096]]}), "413", "a message may hold"),
        ("{", "400", "must be a JSON object"),
    ):
        with pytest.raises(InferenceServerException, match=message) as info:
            client.infer(
                "ppocr-det",
                [tensor_input],
                headers=gateway.headers(),
                parameters={packed.PARAMETER: descriptor},
            )
        assert info.value.status() == status


def test_a_device_reads_the_index_and_the_extensions(
    gateway: GatewayHandle, tmp_path: Path
) -> None:
    (gateway_repo := gateway.gateway.config.repository / "broken" / "1").mkdir(parents=True)
    (gateway_repo / "manifest.json").write_text("{}")
    admin = gateway.headers(gateway.admin_token)
    try:
        with pytest.raises(InferenceServerException):  # its failure is on the index now
            thttp.InferenceServerClient(gateway.http_url).load_model("broken", headers=admin)
        status, full = http_request(gateway.http_url, "/v2/repository/index", b"", admin)
        assert status == 200 and isinstance(full, list)
        failed = next(m for m in full if m["name"] == "broken")
        assert failed["state"] == "UNAVAILABLE" and "reason" in failed
        status, index = http_request(
            gateway.http_url, "/v2/repository/index", b"", gateway.headers()
        )
        assert status == 200 and isinstance(index, list)
        assert {(m["name"], m["state"]) for m in index} >= {
            ("ppocr-det", "READY"),
            ("digits-light", "READY"),
            ("broken", "UNAVAILABLE"),
        }
        assert all("reason" not in m for m in index)  # why one failed is the operator's
        grpc_index = tgrpc.InferenceServerClient(gateway.grpc_url).get_model_repository_index(
            headers=gateway.headers()
        )
        assert {m.name for m in grpc_index.models} >= {"ppocr-det", "digits-light"}
        assert all(not m.reason for m in grpc_index.models)
    finally:
        shutil.rmtree(gateway_repo.parent)
    metadata = thttp.InferenceServerClient(gateway.http_url).get_server_metadata(
        headers=gateway.headers()
    )
    assert {"edge_pictures", "edge_compression"} <= set(metadata["extensions"])
