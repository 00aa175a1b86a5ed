"""Local anonymization without offloading: ``Agent.redact``, the local OIP API's
``redact`` endpoint (HTTP and gRPC, stock tritonclient), and ``edge-agent redact``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from skimage import data
from tritonclient.utils import InferenceServerException

from edge_agent.agent import DEFAULT_POLICY, Agent
from edge_agent.cli import main as edge_agent
from edge_agent.config import ApiSettings
from edge_agent.policy import load_policy
from edge_agent.privacy import FaceFinder, PrivacyInspector, Redaction
from edge_agent.privacy.encoded import decode
from edge_agent.profiles import ProfileStore
from edge_agent.service.frontend import LocalService
from edge_agent.service.grpc_api import GrpcApi
from edge_agent.service.http_api import HttpApi
from edge_agent.service.metrics import ServiceMetrics
from edge_core.errors import InputError
from edge_core.repository import ModelRepository
from tests.support.paths import MODELS, PROFILES


def jpeg(rgb: np.ndarray) -> bytes:
    ok, data_ = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    assert ok
    return data_.tobytes()


@pytest.fixture(scope="module")
def agent(face_detectors: tuple[FaceFinder, FaceFinder]) -> Iterator[Agent]:
    detector, checker = face_detectors
    agent = Agent(
        profile=ProfileStore(PROFILES).get("generic-x86_64"),
        repository=ModelRepository(MODELS),
        rules=load_policy(DEFAULT_POLICY),
        inspector=PrivacyInspector(detector, checker=checker),
    )
    yield agent
    agent.close()


@pytest.fixture(scope="module")
def apis(agent: Agent) -> Iterator[tuple[str, str]]:
    service = LocalService(lambda: agent, ServiceMetrics())
    http = HttpApi(service, ApiSettings(http_port=0, grpc_port=0))
    grpc = GrpcApi(service, ApiSettings(http_port=0, grpc_port=0))
    http.start()
    grpc.start()
    yield http.address, grpc.address
    http.stop()
    grpc.stop(grace=0)


def test_the_agent_redacts_a_tensor_and_an_encoded_picture_on_the_device(
    agent: Agent, face_detectors: tuple[FaceFinder, FaceFinder]
) -> None:
    _, checker = face_detectors
    picture = data.astronaut()
    files = np.array([jpeg(picture)], dtype=object)
    result = agent.redact({"pixels": picture, "file": files})
    assert result.faces == 2 and result.pictures == 2
    assert result.outputs["pixels"].shape == picture.shape
    assert checker.detect(result.outputs["pixels"]) == []
    redacted_file = decode(result.outputs["file"][0])
    assert redacted_file is not None and checker.detect(redacted_file) == []
    filled = agent.redact({"pixels": picture}, Redaction("fill")).outputs["pixels"]
    assert (filled == 0).all(axis=2).mean() > 0.05  # a black square over the head
    with pytest.raises(InputError, match="no input holds a picture"):
        agent.redact({"text": np.array([b"hello"], dtype=object)})


@pytest.mark.slow
def test_the_local_api_has_a_redact_endpoint_over_http_and_grpc(
    apis: tuple[str, str], face_detectors: tuple[FaceFinder, FaceFinder]
) -> None:
    _, checker = face_detectors
    http_address, grpc_address = apis
    blob = np.array([jpeg(data.astronaut())], dtype=object)
    http = httpclient.InferenceServerClient(http_address)
    assert http.get_model_metadata("redact")["name"] == "redact"
    request = httpclient.InferInput("image", [1], "BYTES")
    request.set_data_from_numpy(blob)
    answer = http.infer("redact", [request], parameters={"mode": "blur"})
    assert answer.as_numpy("faces").tolist() == [1]
    out = decode(answer.as_numpy("image")[0])
    assert out is not None and out.shape == (512, 512, 3) and checker.detect(out) == []
    grpc = grpcclient.InferenceServerClient(grpc_address)
    pixels = grpcclient.InferInput("frame", [512, 512, 3], "UINT8")
    pixels.set_data_from_numpy(data.astronaut())
    redacted = grpc.infer("redact", [pixels]).as_numpy("frame")
    assert redacted.shape == (512, 512, 3) and checker.detect(redacted) == []
    with pytest.raises(InferenceServerException, match="unknown redaction mode"):
        http.infer("redact", [request], parameters={"mode": "erase"})


@pytest.mark.slow
def test_edge_agent_redact_writes_pictures_and_videos(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], face_detectors: Any, fetched: Any
) -> None:
    from benchmarks.agent.privacy_video import write_clip

    _, checker = face_detectors
    picture = tmp_path / "astronaut.jpg"
    picture.write_bytes(jpeg(data.astronaut()))
    clip = tmp_path / "clip.avi"
    write_clip(tmp_path / "clip.mp4", seconds=0.4, faces=1)
    (tmp_path / "clip.mp4").rename(clip)
    out = tmp_path / "out"
    options = ["--mode", "fill", "--model-dir", str(MODELS), "--profile", "generic-x86_64"]
    code = edge_agent(["redact", str(picture), str(clip), "--out", str(out), *options])
    assert code == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["faces"] for r in results] == [1, results[1]["faces"]] and results[1]["faces"] >= 9
    assert results[1]["frames"] == 10 and "no sound track" in results[1]["note"]
    redacted = decode((out / "astronaut.jpg").read_bytes())
    assert redacted is not None and checker.detect(redacted) == []
    capture = cv2.VideoCapture(str(out / "clip.avi"))
    frames = 0
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        frames += 1
        assert checker.detect(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)) == []
    assert frames == 10
    assert edge_agent(["redact", str(picture), "--out", str(tmp_path)]) != 0  # not over itself
