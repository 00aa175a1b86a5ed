"""The agent's local API as a camera app uses it: pictures as files, the repository
index, through stock tritonclient (HTTP and gRPC), against `edge-agent run`."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException

from tests.support.daemon import Running, start_agent
from tests.support.paths import MODELS


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    running = start_agent(
        tmp_path_factory.mktemp("local-api"), models=("digits-light", "face-detection-short-range")
    )
    running.wait_message("READY=1")
    yield running
    running.stop()


def request(agent: Running, method: str, path: str) -> tuple[int, object]:
    connection = http.client.HTTPConnection("127.0.0.1", agent.http_port, timeout=10)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_a_camera_picture_is_taken_as_the_cli_takes_it(agent: Running) -> None:
    """A camera app sends a PNG or JPEG: as BYTES elements, or as a raw uint8 file; the
    agent preprocesses it as the manifest says (as `edge-agent infer` does). It was a 400
    ("BYTES cannot be converted safely to the expected FP32")."""
    import cv2
    import tritonclient.http as thttp

    from edge_core.repository import ModelRepository

    package = ModelRepository(MODELS).get("digits-light")
    pixels, labels = package.evaluation()
    picture = np.clip(pixels[3].reshape(8, 8) * 16, 0, 255).astype(np.uint8)
    picture = cv2.resize(picture, (64, 64), interpolation=cv2.INTER_NEAREST)
    png = cv2.imencode(".png", picture)[1].tobytes()
    jpeg = cv2.imencode(".jpg", picture)[1].tobytes()
    client = thttp.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
    as_bytes = thttp.InferInput("pixels", [2], "BYTES")
    as_bytes.set_data_from_numpy(np.array([png, jpeg], dtype=object))
    answer = client.infer("digits-light", [as_bytes]).as_numpy("probabilities")
    assert answer.shape == (2, 10) and list(answer.argmax(axis=1)) == [labels[3], labels[3]]
    raw = thttp.InferInput("pixels", [len(png)], "UINT8")
    raw.set_data_from_numpy(np.frombuffer(png, np.uint8))
    assert client.infer("digits-light", [raw]).as_numpy("probabilities").argmax() == labels[3]
    broken = thttp.InferInput("pixels", [1], "BYTES")
    broken.set_data_from_numpy(np.array([png[:40]], dtype=object))
    with pytest.raises(InferenceServerException, match="cannot decode the image"):
        client.infer("digits-light", [broken])
    client.close()


def test_the_repository_index_answers_on_the_agent(agent: Running) -> None:
    import tritonclient.http as thttp

    http = thttp.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
    index = http.get_model_repository_index()
    assert {"name": "digits-light", "version": "1", "state": "READY"} in index
    assert {"name": "redact", "version": "1", "state": "READY"} in index  # the endpoint
    http.close()
    grpc_client = tgrpc.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    models = grpc_client.get_model_repository_index(as_json=True)["models"]
    assert {"name": "digits-light", "version": "1", "state": "READY"} in models
    grpc_client.close()
    status, document = request(agent, "GET", "/v2/models")
    assert status == 200 and document == {
        "models": ["digits-light", "face-detection-short-range", "redact"]
    }


@pytest.mark.slow
def test_a_detectors_boxes_come_back_as_the_results_output(agent: Running) -> None:
    """Ask for the output named `results`: one JSON document a picture, the boxes in the
    pixels of the picture sent, beside the model's own outputs."""
    import cv2
    import tritonclient.http as thttp
    from skimage import data

    photo = cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR)  # 512 x 512, a face
    client = thttp.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
    wanted = [thttp.InferRequestedOutput("results"), thttp.InferRequestedOutput("classificators")]
    rows = []
    for picture in (photo, cv2.resize(photo, (1024, 768))):
        pictures = thttp.InferInput("input", [1], "BYTES")
        pictures.set_data_from_numpy(
            np.array([cv2.imencode(".jpg", picture)[1].tobytes()], dtype=object)
        )
        answer = client.infer("face-detection-short-range", [pictures], outputs=wanted)
        assert answer.as_numpy("classificators").shape == (1, 896, 1)
        (row,) = answer.as_numpy("results")
        rows.append(json.loads(row))
    first, second = rows
    assert first["coordinates"] == "image" and [d["label"] for d in first["detections"]] == ["face"]
    x0, y0, x1, y1 = first["detections"][0]["box"]
    assert 150 < x0 < 230 < x1 < 300 and 50 < y0 < 130 < y1 < 200  # the astronaut's face
    scaled = second["detections"][0]["box"]  # the same face, 2x wide and 1.5x high
    assert scaled == pytest.approx([x0 * 2, y0 * 1.5, x1 * 2, y1 * 1.5], abs=12)
    with pytest.raises(InferenceServerException, match="unknown output 'nothing'"):
        client.infer("face-detection-short-range", [pictures],
                     outputs=[thttp.InferRequestedOutput("nothing")])  # fmt: skip
    digits = thttp.InferInput("pixels", [1, 64], "FP32")
    digits.set_data_from_numpy(np.zeros((1, 64), np.float32))
    (row,) = client.infer(
        "digits-light", [digits], outputs=[thttp.InferRequestedOutput("results")]
    ).as_numpy("results")
    assert set(json.loads(row)) == {"top_k"}  # a classifier's: its top labels
    client.close()
