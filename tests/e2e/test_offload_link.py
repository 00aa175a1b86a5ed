"""Offload sized for the link, end to end: an agent and a real gateway on loopback.

Pictures leave as pictures over every transport and are answered as their tensors are;
a redacted picture is checked again as encoded; nothing malformed, and nothing for a
model the cloud lacks, leaves the device; the bytes and the link are learnt."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import tritonclient.http as thttp
from skimage import data

from edge_agent.agent import DEFAULT_POLICY, Agent
from edge_agent.offload import CircuitBreaker, ExitGuard, OffloadClient, make_transport
from edge_agent.offload.base import Transport
from edge_agent.policy import Action, PolicyRules, load_policy
from edge_agent.privacy import PrivacyInspector
from edge_agent.privacy.faces import FaceFinder
from edge_agent.profiles import ProfileStore
from edge_agent.profiles.state import DeviceState
from edge_agent.reports import offload_report
from edge_agent.service.metrics import ServiceMetrics
from edge_core.errors import InputError, ModelNotFoundError, OffloadRejected, PrivacyRefusal
from edge_core.pictures import image_to_tensor
from edge_core.protocol.types import InferRequest
from edge_core.repository import ModelRepository
from tests.support.daemon import metric_value
from tests.support.gateway import GatewayHandle, start_gateway
from tests.support.gateway_calls import metric, ocr_repository
from tests.support.packages import low_and_high_confidence
from tests.support.paths import MODELS, PROFILES

RULES = load_policy(DEFAULT_POLICY)
OUTPUT = "sigmoid_0.tmp_0"
RAW = 3 * 480 * 640 * 4  # a 640x480 picture as PP-OCR's FP32 input tensor


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, fetched: ModelRepository
) -> Iterator[GatewayHandle]:
    """PP-OCR's detector and the light digits model; not the heavy one."""
    tmp = tmp_path_factory.mktemp("link")
    handle = start_gateway(tmp, ocr_repository(tmp, fetched), poll_interval_s=0.0)
    yield handle
    handle.thread.stop()


def device_models(tmp: Path, fetched: ModelRepository) -> ModelRepository:
    """What the device holds: both digits models and PP-OCR's manifest."""
    root = tmp / "device"
    for name in ("digits-light", "digits-heavy"):
        shutil.copytree(MODELS / name, root / name)
    shutil.copytree(fetched.root / "ppocr-det", root / "ppocr-det")
    return ModelRepository(root)


def agent_over(
    transport: Transport,
    models: ModelRepository,
    rules: PolicyRules = RULES,
    detector: FaceFinder | None = None,
    state: DeviceState | None = None,
) -> Agent:
    inspector = PrivacyInspector(detector)

    def preprocessing(model: str) -> Any:
        return models.get(model).preprocessing if model in models.names() else None

    offload = OffloadClient(
        transport,
        guard=ExitGuard(inspector, rules, preprocessing=preprocessing),
        breaker=CircuitBreaker(),
        retries=1,
    )
    return Agent(
        profile=ProfileStore(PROFILES).get("generic-x86_64"),
        repository=models,
        rules=rules,
        offload=offload,
        inspector=inspector,
        device_state=lambda: state or DeviceState(),
    )


def frame(models: ModelRepository, picture: np.ndarray) -> dict[str, np.ndarray]:
    pre = models.get("ppocr-det").preprocessing
    assert pre is not None
    bgr = cv2.resize(cv2.cvtColor(picture, cv2.COLOR_RGB2BGR), (640, 480))
    return {"x": image_to_tensor(bgr, pre)}


def text_iou(a: np.ndarray, b: np.ndarray, threshold: float = 0.3) -> float:
    """The IoU of two text maps' regions (where each says text)."""
    mine, theirs = a > threshold, b > threshold
    union = np.logical_or(mine, theirs).sum()
    return 1.0 if union == 0 else float(np.logical_and(mine, theirs).sum() / union)


def transport_for(protocol: str, gateway: GatewayHandle) -> Transport:
    address = gateway.grpc_url if protocol == "grpc" else gateway.http_url
    return make_transport(protocol, address, token=gateway.device_token)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_picture_leaves_encoded_and_is_answered_as_its_tensor(
    gateway: GatewayHandle,
    fetched: ModelRepository,
    face_detectors: tuple[FaceFinder, FaceFinder],
    tmp_path: Path,
    protocol: str,
) -> None:
    models = device_models(tmp_path, fetched)
    detector = face_detectors[0]
    encoded = agent_over(transport_for(protocol, gateway), models, detector=detector)
    tensors = replace(RULES, picture_format="tensor")
    raw = agent_over(transport_for(protocol, gateway), models, tensors, detector=detector)
    try:
        for picture in (data.text(), data.coffee(), data.chelsea()):
            inputs = frame(models, picture if picture.ndim == 3 else np.dstack([picture] * 3))
            small = encoded.infer("ppocr-det", inputs, deadline_ms=5000)
            large = raw.infer("ppocr-det", inputs, deadline_ms=5000)
            assert small.where == large.where == "cloud"
            assert small.wire_bytes is not None and large.wire_bytes is not None
            assert small.wire_bytes[0] <= RAW / 20 < large.wire_bytes[0]
            assert small.to_dict()["bytes_sent"] == small.wire_bytes[0]
            assert small.outputs[OUTPUT].shape == large.outputs[OUTPUT].shape == (1, 1, 480, 640)
            assert text_iou(small.outputs[OUTPUT], large.outputs[OUTPUT]) >= 0.9
            # the text map is mostly zeros: it comes back packed, a few KB
            assert small.wire_bytes[1] < large.outputs[OUTPUT].nbytes / 20
        report = offload_report(encoded)
        assert report is not None
        assert report["traffic"]["ppocr-det"]["answered"] == 3
        assert report["link"]["bytes_sent"] < RAW / 20 * 3
        assert report["link"]["rtt_ms"] is not None  # learnt from its own exchanges
        estimate = encoded.offload.estimate("ppocr-det", RAW, picture=True)  # type: ignore[union-attr]
        assert estimate is not None and estimate.bytes_up < RAW / 20
        text = ServiceMetrics(lambda: {"offload": report}).render().decode()
        sent = metric_value(
            text, "edge_agent_offload_bytes_sent_total", transport=protocol, model="ppocr-det"
        )
        assert sent == report["traffic"]["ppocr-det"]["sent"] > 0
        assert metric_value(text, "edge_agent_offload_link_rtt_seconds") > 0
    finally:
        encoded.close()
        raw.close()


def test_a_redacted_picture_is_checked_again_as_it_leaves_encoded(
    gateway: GatewayHandle, fetched: ModelRepository, face_detectors: tuple[FaceFinder, FaceFinder]
) -> None:
    detector, checker = face_detectors
    seen: list[str] = []

    class Spy(PrivacyInspector):
        def inspect(self, inputs: dict[str, np.ndarray], *args: Any, **kwargs: Any) -> Any:
            seen.extend(f"{name}:{array.dtype}" for name, array in inputs.items())
            return super().inspect(inputs, *args, **kwargs)

    package = fetched.get("ppocr-det")
    client = OffloadClient(
        transport_for("grpc", gateway),
        guard=ExitGuard(
            Spy(detector, checker=checker), RULES, preprocessing=lambda m: package.preprocessing
        ),
    )
    before = metric(gateway, "gateway_requests_total", model="ppocr-det")
    request = InferRequest(
        inputs=frame(ModelRepository(fetched.root), data.astronaut()),
        datatypes={"x": "FP32"},
        model_name="ppocr-det",
    )
    try:  # claimed redacted, and not: the face is seen in the JPEG that would leave
        with pytest.raises(PrivacyRefusal, match="still shows faces"):
            client.infer(
                request,
                deadline=time.monotonic() + 5,
                label="personal",
                redacted=True,
                package=package,
            )
        assert seen == ["x:object"]  # searched as the encoded file, not as the tensor
        assert client.guard.refusals == {"still_identifiable": 1}
        assert metric(gateway, "gateway_requests_total", model="ppocr-det") == before
    finally:
        client.close()


def test_nothing_leaves_for_a_model_the_cloud_lacks(
    gateway: GatewayHandle, fetched: ModelRepository, tmp_path: Path
) -> None:
    models = device_models(tmp_path, fetched)
    busy = DeviceState(cpu_load=0.97)
    agent = agent_over(transport_for("grpc", gateway), models, state=busy)
    assert agent.offload is not None
    x = {"pixels": models.get("digits-light").evaluation()[0][:1].astype(np.float32)}
    try:
        agent.offload.catalog.refresh()  # as the background refresh would
        assert agent.offload.catalog.lacks("digits-heavy")
        # cloud-only and not in the cloud: nothing sent; the light model that escalates
        # to it stands in up front, marked degraded
        result = agent.infer("digits-heavy", x)
        assert (result.decision.action, result.decision.reason) == (
            Action.LOCAL_DEGRADED,
            "not_in_cloud",
        )
        assert (result.where, result.model, result.degraded) == ("device", "digits-light", True)
        # an unsure light answer would escalate to it (on a quiet device): it stands
        quiet = agent_over(transport_for("grpc", gateway), models)
        try:
            assert quiet.offload is not None
            quiet.offload.catalog.refresh()
            result = quiet.infer("digits-light", {"pixels": low_and_high_confidence()[0]})
            assert (result.where, result.decision.reason) == ("device", "not_in_cloud")
        finally:
            quiet.close()
        # the busy device would offload digits-light: the cloud has it, so it goes
        assert agent.infer("digits-light", x).where == "cloud"
        assert metric(gateway, "gateway_requests_total", model="digits-heavy") == 0
    finally:
        agent.close()
    # before any index, an unsure light answer whose heavy model neither the device nor
    # the cloud has: the cloud's metadata says so, and the local answer stands, degraded
    light_only = tmp_path / "light-only"
    shutil.copytree(MODELS / "digits-light", light_only / "digits-light")
    fresh = agent_over(transport_for("grpc", gateway), ModelRepository(light_only))
    try:
        result = fresh.infer("digits-light", {"pixels": low_and_high_confidence()[0]})
        assert result.where == "device" and result.model == "digits-light"
        if result.decision.reason != "not_in_cloud":  # the index was not listed yet
            assert result.degraded and "the cloud does not have it" in (result.error or "")
    finally:
        fresh.close()
    # a model neither the device nor the cloud has, and nothing to stand in: said so
    agent = agent_over(transport_for("grpc", gateway), models)
    try:
        assert agent.offload is not None
        agent.offload.catalog.refresh()
        with pytest.raises(ModelNotFoundError) as info:
            agent.infer("digits-xxl", x)
        assert str(info.value) == (
            "unknown model 'digits-xxl': digits-xxl is not installed here and the cloud "
            "does not have it"
        )
    finally:
        agent.close()


def test_a_malformed_request_never_leaves_the_device(
    gateway: GatewayHandle, fetched: ModelRepository, tmp_path: Path
) -> None:
    models = device_models(tmp_path, fetched)
    shutil.rmtree(models.root / "digits-heavy")  # a model only the cloud has... not
    busy = DeviceState(cpu_load=0.97)
    agent = agent_over(transport_for("grpc", gateway), models, state=busy)
    before = metric(gateway, "gateway_requests_total", model="digits-light")
    wrong = {"pixels": np.zeros((1, 63), np.float32)}
    try:
        # a busy device would offload it: checked against the manifest first
        with pytest.raises(InputError, match=r"shape \[1, 63\], expected \[\?, 64\]"):
            agent.infer("digits-light", wrong)
        # a model the device does not hold: checked against the cloud's metadata
        shutil.copytree(MODELS / "digits-light", gateway.gateway.config.repository / "digits-xl")
        manifest = gateway.gateway.config.repository / "digits-xl" / "1" / "manifest.json"
        manifest.write_text(manifest.read_text().replace('"digits-light"', '"digits-xl"'))
        admin = gateway.headers(gateway.admin_token)
        thttp.InferenceServerClient(gateway.http_url).load_model("digits-xl", headers=admin)
        assert agent.offload is not None
        agent.offload.catalog.refresh()  # published since: the next refresh lists it
        with pytest.raises(InputError, match=r"shape \[1, 63\], expected \[\?, 64\]"):
            agent.infer("digits-xl", wrong)
        with pytest.raises(ModelNotFoundError, match="digits-xxl is not installed here and "):
            agent.infer("digits-xxl", wrong)  # the index does not list it
        fresh = OffloadClient(transport_for("http", gateway))  # no index yet: asked
        request = InferRequest(wrong, {"pixels": "FP32"}, model_name="digits-xxl")
        with pytest.raises(OffloadRejected, match="not on this device and the cloud does") as no:
            fresh.infer(request, deadline=time.monotonic() + 5)
        assert no.value.status == "404"  # the gateway's verdict, as its own 404 would say
        fresh.close()
        assert metric(gateway, "gateway_requests_total", model="digits-light") == before
        assert metric(gateway, "gateway_requests_total", model="digits-xl") == 0
        assert agent.infer("digits-xl", {"pixels": np.zeros((1, 64))}).where == "cloud"
    finally:
        agent.close()
        shutil.rmtree(gateway.gateway.config.repository / "digits-xl", ignore_errors=True)


@pytest.mark.broker
def test_over_mqtt_pictures_leave_encoded_once_the_answers_name_the_extension(
    tmp_path: Path, fetched: ModelRepository, face_detectors: tuple[FaceFinder, FaceFinder]
) -> None:
    from edge_agent.offload.mqtt import MqttTransport
    from tests.support.mqtt_fleet import running_fleet

    models = device_models(tmp_path, fetched)
    with running_fleet(tmp_path / "fleet", packages=(fetched.root / "ppocr-det",)) as fleet:
        connection = fleet.connection("cam-01")
        connection.start()
        assert connection.wait_connected(10)
        transport = MqttTransport(connection, token=fleet.tokens["cam-01"])
        agent = agent_over(transport, models, detector=face_detectors[0])
        inputs = frame(models, data.coffee())
        try:
            # MQTT carries requests only: nothing is known of the gateway before it answers
            first = agent.infer("ppocr-det", inputs, deadline_ms=10_000)
            second = agent.infer("ppocr-det", inputs, deadline_ms=10_000)
            assert first.where == second.where == "cloud"
            assert first.wire_bytes is not None and second.wire_bytes is not None
            assert first.wire_bytes[0] > RAW  # the tensor
            assert second.wire_bytes[0] <= RAW / 20  # the JPEG
            assert second.wire_bytes[1] < first.wire_bytes[1] / 20  # the map, packed
            assert text_iou(first.outputs[OUTPUT], second.outputs[OUTPUT]) >= 0.9
        finally:
            agent.close()
            connection.close()


def test_the_running_service_explains_with_what_it_learnt_of_the_link(tmp_path: Path) -> None:
    """The local API's explain, and `policy explain --service`, give the running
    agent's decision: with the link's round trip and the gateway's time it learnt."""
    import json
    import subprocess
    import sys

    from tests.support.daemon import start_agent
    from tests.support.paths import ROOT

    gateway = start_gateway(tmp_path / "gateway", MODELS, poll_interval_s=0.0)
    token = tmp_path / "device.token"
    token.write_text(gateway.device_token)
    token.chmod(0o600)
    extra = f'[gateway]\naddress = "{gateway.grpc_url}"\ntoken_file = "{token}"\n'
    running = start_agent(tmp_path / "agent", extra=extra, models=("digits-light", "digits-heavy"))
    x = ModelRepository(MODELS).get("digits-heavy").evaluation()[0][:1].astype(np.float32)
    document = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                            "data": x.ravel().tolist()}]}  # fmt: skip
    try:
        running.wait_message("READY=1")
        for _ in range(3):
            status, answer = running.post_json("/v2/models/digits-heavy/infer", document)
            assert status == 200 and answer["parameters"]["edge_where"] == "cloud"
            assert answer["parameters"]["edge_bytes_sent"] > 256  # its 64 floats and more
        status, explained = running.post_json("/v2/models/digits-heavy/explain", document)
        assert status == 200, explained
        assert (explained["decision"], explained["reason"]) == ("OFFLOAD", "cloud_only")
        estimate = explained["details"]["cloud_estimate"]
        assert estimate["rtt_ms"] > 0 and estimate["server_ms"] > 0
        assert estimate["bytes_up"] > 256 and estimate["total_ms"] >= estimate["server_ms"]
        np.save(tmp_path / "x.npy", x)
        cli = subprocess.run(
            [sys.executable, "-m", "edge_agent", "policy", "explain", "--service",
             "--config", str(running.config), "--model", "digits-heavy",
             "--input", str(tmp_path / "x.npy")],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        assert json.loads(cli.stdout)["details"]["cloud_estimate"]["rtt_ms"] > 0
        metrics = running.get("/metrics")[1].decode()
        sent = metric_value(
            metrics, "edge_agent_offload_bytes_sent_total", transport="grpc", model="digits-heavy"
        )
        assert sent >= 3 * 256
    finally:
        running.stop()
        gateway.thread.stop()
