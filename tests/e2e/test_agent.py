"""The agent end to end against a real gateway on loopback: privacy, escalation, fallback."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from skimage import data

from cloud_gateway import GatewayConfig, GatewayThread
from edge_agent.agent import DEFAULT_POLICY, Agent
from edge_agent.offload import CircuitBreaker, ExitGuard, OffloadClient, make_transport
from edge_agent.policy import Action, load_policy
from edge_agent.preprocess import tensor_to_image
from edge_agent.privacy import FaceFinder, PrivacyInspector
from edge_agent.profiles import ProfileStore
from edge_agent.profiles.state import DeviceState
from edge_core.errors import InputError, OffloadError, PolicyRejected, PrivacyRefusal
from edge_core.package import ModelPackage
from edge_core.pictures import image_to_tensor
from edge_core.protocol.types import InferRequest
from edge_core.repository import ModelRepository
from tests.support.backends import RecordingBackend
from tests.support.gateway import GatewayHandle, start_gateway
from tests.support.gateway_calls import direct, metric
from tests.support.packages import low_and_high_confidence
from tests.support.paths import MODELS, PROFILES

RULES = load_policy(DEFAULT_POLICY)


@pytest.fixture(scope="module")
def detector(face_detectors: tuple[FaceFinder, FaceFinder]) -> FaceFinder:
    return face_detectors[0]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, fetched: ModelRepository):  # type: ignore[no-untyped-def]
    backend = RecordingBackend()
    handle = start_gateway(
        tmp_path_factory.mktemp("agent-gw"), MODELS, backend=backend, poll_interval_s=0.0
    )
    handle.backend = backend  # type: ignore[attr-defined]
    yield handle
    handle.thread.stop()


def make_agent(
    handle_or_address: Any,
    token: str,
    detector: FaceFinder | None,
    *,
    breaker: CircuitBreaker | None = None,
    checker: FaceFinder | None = None,
) -> Agent:
    repository = ModelRepository(MODELS)
    inspector = PrivacyInspector(detector, checker=checker)
    address = (
        handle_or_address if isinstance(handle_or_address, str) else handle_or_address.grpc_url
    )

    def preprocessing(model: str) -> Any:
        return repository.get(model).preprocessing

    offload = OffloadClient(
        make_transport("grpc", address, token=token),
        guard=ExitGuard(inspector, RULES, preprocessing=preprocessing),
        breaker=breaker or CircuitBreaker(),
        retries=1,
    )
    return Agent(
        profile=ProfileStore(PROFILES).get("generic-x86_64"),
        repository=repository,
        rules=RULES,
        offload=offload,
        inspector=inspector,
        device_state=lambda: DeviceState(),
    )


def picture(name: str, fetched: ModelRepository) -> dict[str, np.ndarray]:
    pre = fetched.get("ppocr-det").preprocessing
    assert pre is not None
    return {"x": image_to_tensor(cv2.cvtColor(getattr(data, name)(), cv2.COLOR_RGB2BGR), pre)}


def test_a_sensitive_image_never_reaches_the_gateway(
    served: GatewayHandle, fetched: ModelRepository, detector: FaceFinder
) -> None:
    agent = make_agent(served, served.device_token, detector)
    before = metric(served, "gateway_requests_total", model="ppocr-det")
    received = len(served.backend.received.get("ppocr-det", []))  # type: ignore[attr-defined]
    with pytest.raises(PolicyRejected, match="may_not_leave") as info:
        agent.infer("ppocr-det", picture("astronaut", fetched), label="sensitive")
    assert info.value.decision.action == Action.REJECT  # type: ignore[attr-defined]
    # defence in depth: even sent straight to the offload client, it does not leave
    request = InferRequest(
        inputs=picture("coffee", fetched), datatypes={"x": "FP32"}, model_name="ppocr-det"
    )
    assert agent.offload is not None
    with pytest.raises(PrivacyRefusal):
        agent.offload.infer(request, deadline=time.monotonic() + 5, label="sensitive")
    with pytest.raises(PrivacyRefusal):  # faces, claimed "redacted" but not
        agent.offload.infer(
            InferRequest(
                inputs=picture("astronaut", fetched),
                datatypes={"x": "FP32"},
                model_name="ppocr-det",
            ),
            deadline=time.monotonic() + 5,
            label="personal",
            redacted=True,
        )
    assert metric(served, "gateway_requests_total", model="ppocr-det") == before
    assert metric(served, "gateway_request_failures_total", model="ppocr-det") == 0
    assert len(served.backend.received.get("ppocr-det", [])) == received  # type: ignore[attr-defined]
    assert agent.offload.guard.refusals == {"sensitive": 1, "still_identifiable": 1}
    agent.close()


def test_what_the_gateway_receives_of_a_redacted_image_shows_no_face(
    served: GatewayHandle, fetched: ModelRepository, detector: FaceFinder
) -> None:
    agent = make_agent(served, served.device_token, detector)
    inputs = picture("astronaut", fetched)
    assert len(detector.detect(data.astronaut())) == 1
    result = agent.infer("ppocr-det", inputs)
    assert result.decision.action == Action.OFFLOAD_REDACTED and result.where == "cloud"
    assert (
        result.decision.label == "personal"
        and result.findings is not None
        and result.findings.face_count == 1
    )
    assert result.outputs["sigmoid_0.tmp_0"].shape == (1, 1, 512, 512)
    received = served.backend.received["ppocr-det"][-1]["x"]  # type: ignore[attr-defined]
    # rebuilt into a picture on the gateway's side: no face
    view = tensor_to_image(received[0], fetched.get("ppocr-det").preprocessing)
    assert view is not None
    assert detector.detect(view.rgb) == []
    # and the rest of the picture made it through (as a JPEG: within its loss)
    original = tensor_to_image(inputs["x"][0], fetched.get("ppocr-det").preprocessing)
    assert original is not None
    close = np.abs(view.rgb.astype(int) - original.rgb.astype(int)).max(axis=2) <= 24
    assert np.mean(close) > 0.85
    agent.close()


def test_a_personal_picture_with_a_small_face_arrives_at_the_gateway_without_it(
    served: GatewayHandle, fetched: ModelRepository, face_detectors: tuple[FaceFinder, FaceFinder]
) -> None:
    """A 40 px face (the astronaut's head) in a 640x480 photograph: found, hidden, and
    what the gateway's model receives shows no face to the stronger check."""
    detector, checker = face_detectors
    pre = fetched.get("ppocr-det").preprocessing
    assert pre is not None
    scene = cv2.resize(data.coffee(), (640, 480))
    head = data.astronaut()[20:230, 130:320]  # the face is 120 of its 210 px
    small = cv2.resize(head, (head.shape[1] // 3, head.shape[0] // 3), interpolation=cv2.INTER_AREA)
    y, x = 300, 420
    scene[y : y + small.shape[0], x : x + small.shape[1]] = small
    agent = make_agent(served, served.device_token, detector, checker=checker)
    inputs = {"x": image_to_tensor(cv2.cvtColor(scene, cv2.COLOR_RGB2BGR), pre)}
    result = agent.infer("ppocr-det", inputs, label="personal")
    assert result.decision.action == Action.OFFLOAD_REDACTED and result.where == "cloud"
    assert result.findings is not None and result.findings.face_count == 1
    received = served.backend.received["ppocr-det"][-1]["x"]  # type: ignore[attr-defined]
    view = tensor_to_image(received[0], pre)  # at the gateway, rebuilt into a picture
    assert view is not None and view.rgb.shape == (480, 640, 3)
    assert checker.detect(view.rgb) == []
    where = view.rgb[y : y + small.shape[0], x : x + small.shape[1]].astype(int)
    assert np.abs(where - small).mean() > 20  # the head is hidden, not only its eyes
    agent.close()


def test_a_low_confidence_input_is_escalated_to_the_heavy_model(
    served: GatewayHandle, detector: FaceFinder
) -> None:
    agent = make_agent(served, served.device_token, detector)
    low, high = low_and_high_confidence()
    result = agent.infer("digits-light", {"pixels": low})
    assert result.escalated and result.where == "cloud" and result.model == "digits-heavy"
    assert (result.decision.action, result.decision.reason) == (Action.OFFLOAD, "low_confidence")
    assert np.allclose(result.outputs["probabilities"], direct("digits-heavy", low), atol=1e-6)
    sure = agent.infer("digits-light", {"pixels": high})
    assert not sure.escalated and sure.where == "device" and sure.decision.reason == "confident"
    assert agent.stats.decisions.snapshot()[("OFFLOAD", "low_confidence")] == 1
    agent.close()


def test_integer_pixels_leave_in_the_datatype_the_cloud_model_takes(
    served: GatewayHandle, detector: FaceFinder
) -> None:
    """The held-out digits are uint8; the models take FP32. The runtime casts them on the
    device; what is offloaded is cast the same way before it leaves (the gateway, as
    Triton, refuses a datatype that is not the model's)."""
    agent = make_agent(served, served.device_token, detector)
    low, _ = low_and_high_confidence()
    assert np.array_equal(low, low.astype(np.uint8))
    try:
        result = agent.infer("digits-light", {"pixels": low.astype(np.uint8)})
        with pytest.raises(InputError, match="cannot be converted safely"):  # and not sent
            agent.infer("digits-heavy", {"pixels": np.full((1, 64), 1e40)})
    finally:
        agent.close()
    assert result.escalated and result.where == "cloud" and not result.degraded
    assert np.allclose(result.outputs["probabilities"], direct("digits-heavy", low), atol=1e-6)


@pytest.mark.slow
def test_gateway_down_gives_degraded_answers_in_time_and_back_closes_the_breaker(
    tmp_path: Path, detector: FaceFinder
) -> None:
    handle = start_gateway(tmp_path, MODELS, poll_interval_s=0.0)
    ports = {"http_port": handle.gateway.http_port, "grpc_port": handle.gateway.grpc_port}
    agent = make_agent(
        # a cooldown long enough that a stalled machine does not half-open it mid-test
        handle.grpc_url,
        handle.device_token,
        detector,
        breaker=CircuitBreaker(2, cooldown_s=1.5),
    )
    low, _ = low_and_high_confidence()
    assert agent.infer("digits-light", {"pixels": low}).where == "cloud"
    handle.thread.stop()
    answers = []
    for _ in range(4):
        started = time.monotonic()
        result = agent.infer("digits-light", {"pixels": low}, deadline_ms=300)
        answers.append((result, time.monotonic() - started))
    for result, seconds in answers:
        assert result.degraded and result.where == "device" and result.model == "digits-light"
        assert seconds < 0.3 + 0.15  # the deadline, and room for a busy machine
    # the first two tried the cloud and failed, the breaker opened: no more tries
    assert [r.decision.action for r, _ in answers] == [Action.LOCAL_DEGRADED] * 4
    assert [r.decision.reason for r, _ in answers] == ["offload_failed"] * 2 + ["breaker_open"] * 2
    assert all("digits-light answers" in r.decision.message for r, _ in answers[:2])
    counts = agent.stats.decisions.snapshot()
    assert counts[("LOCAL_DEGRADED", "offload_failed")] == 2
    assert counts[("LOCAL_DEGRADED", "breaker_open")] == 2
    assert counts[("OFFLOAD", "low_confidence")] == 3  # escalations decided, two of them failed
    assert agent.offload is not None and agent.offload.breaker.state == "open"
    # a cloud-only model, while the breaker is open: its stand-in answers at once
    heavy = agent.infer("digits-heavy", {"pixels": low}, deadline_ms=300)
    assert heavy.degraded and heavy.model == "digits-light" and heavy.where == "device"
    assert (heavy.decision.action, heavy.decision.reason) == (
        Action.LOCAL_DEGRADED,
        "cloud_unreachable",
    )
    # the gateway comes back on the same ports
    config = GatewayConfig(
        repository=MODELS, state_dir=tmp_path / "state", poll_interval_s=0.0, **ports
    )
    again = GatewayThread(config)
    try:
        end = time.monotonic() + 15
        while True:
            time.sleep(1.6)  # past the cooldown: the next request is the probe
            result = agent.infer("digits-light", {"pixels": low}, deadline_ms=2000)
            if result.where == "cloud" or time.monotonic() > end:
                break
        assert result.where == "cloud" and result.escalated
        assert agent.offload.breaker.state == "closed"
    finally:
        again.stop()
        agent.close()


@pytest.mark.slow
def test_fallback_tiers_cache_then_error(
    tmp_path: Path, fetched: ModelRepository, detector: FaceFinder
) -> None:
    handle = start_gateway(tmp_path, MODELS, poll_interval_s=0.0)
    agent = make_agent(handle, handle.device_token, detector)
    try:
        coffee = picture("coffee", fetched)
        first = agent.infer("ppocr-det", coffee)
        assert first.where == "cloud" and not first.cached
        digits = {"pixels": low_and_high_confidence()[1]}
        heavy = agent.infer("digits-heavy", digits)
        assert heavy.where == "cloud"
    finally:
        handle.thread.stop()
    # the cloud is gone: the same picture is answered from the cache
    again = agent.infer("ppocr-det", coffee, deadline_ms=500)
    assert again.cached and again.where == "cache" and again.degraded
    assert np.array_equal(again.outputs["sigmoid_0.tmp_0"], first.outputs["sigmoid_0.tmp_0"])
    # a cloud-only model with a light stand-in: the light model answers, degraded
    stand_in = agent.infer("digits-heavy", digits, deadline_ms=500)
    assert stand_in.model == "digits-light" and stand_in.degraded and stand_in.where == "device"
    # nothing can stand in for a new picture: a clear error, in time
    started = time.monotonic()
    with pytest.raises(OffloadError, match="no local model or cached answer for 'ppocr-det'"):
        agent.infer("ppocr-det", picture("chelsea", fetched), deadline_ms=500)
    assert time.monotonic() - started < 0.5 + 0.3  # within the deadline (a busy machine)
    agent.close()


class SilentServer:
    """Accepts connections and never answers: a gateway that hangs."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[Any] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
        for connection in self.held:
            connection.close()


@pytest.mark.slow
def test_a_hanging_gateway_costs_no_more_than_the_deadline(detector: FaceFinder) -> None:
    server = SilentServer()
    agent = make_agent(f"127.0.0.1:{server.port}", "cam-01.x", detector)
    try:
        digits = {"pixels": low_and_high_confidence()[1]}
        for _ in range(3):
            started = time.monotonic()
            result = agent.infer("digits-heavy", digits, deadline_ms=200)  # cloud-only: offloaded
            elapsed = time.monotonic() - started
            assert result.degraded and result.model == "digits-light"  # the light stand-in
            # it stopped waiting for the gateway at the deadline (not at gRPC's own
            # timeout), the stand-in's few ms kept in reserve; room for a busy machine
            assert elapsed < 0.2 + 0.15, elapsed
    finally:
        agent.close()
        server.close()


def test_an_unknown_label_is_an_input_error(served: GatewayHandle) -> None:

    agent = make_agent(served, served.device_token, None)
    with pytest.raises(
        InputError, match="unknown label 'Sensitive'; expected one of public, personal, sensitive"
    ):
        agent.infer("digits-light", {"pixels": low_and_high_confidence()[1]}, label="Sensitive")
    agent.close()


def local_agent(repository: Any = None) -> Agent:
    """An agent with no gateway, on this machine's generic profile."""
    return Agent(
        profile=ProfileStore(PROFILES).get("generic-x86_64"),
        repository=repository or ModelRepository(MODELS),
        rules=RULES,
        device_state=lambda: DeviceState(),
    )


def test_an_empty_batch_is_refused_before_anything_runs() -> None:
    from edge_core.errors import InputError

    agent = local_agent()
    empty = {"pixels": np.zeros((0, 64), np.float32)}
    message = r"input 'pixels' is an empty batch \(shape \[0, 64\]\): at least one row is expected"
    with pytest.raises(InputError, match=message):
        agent.infer("digits-light", empty)
    with pytest.raises(InputError, match=message):
        agent.explain("digits-light", empty)
    ragged = {"pixels": [[0.0] * 64, [0.0] * 10]}
    with pytest.raises(InputError, match=r"input 'pixels' is not a tensor.*equal length"):
        agent.infer("digits-light", ragged)
    assert agent.loaded() == {}  # not even loaded
    assert agent.stats.decisions.total() == 0
    agent.close()


class SlowSource:
    """The model repository, slow to hand out a package (our ModelSource seam)."""

    def __init__(self, delay: float) -> None:
        self.repository = ModelRepository(MODELS)
        self.delay = delay

    def get(self, name: str) -> ModelPackage:
        time.sleep(self.delay)
        return self.repository.get(name)


@pytest.mark.slow
def test_latency_leaves_out_loading_the_model_which_is_reported_apart() -> None:
    agent = local_agent(SlowSource(0.3))
    x = {"pixels": low_and_high_confidence()[1]}
    assert agent.package("digits-light") is not None  # the manifest read: what policy needs
    first = agent.infer("digits-light", x)
    assert first.where == "device" and first.load_ms is not None and first.load_ms >= 300
    assert first.latency_ms < 100, first.latency_ms  # the run, not the load
    assert first.to_dict()["load_ms"] == round(first.load_ms, 2)
    second = agent.infer("digits-light", x)
    assert second.load_ms is None and "load_ms" not in second.to_dict()
    assert second.latency_ms < 100
    agent.close()


def test_the_deadline_counts_the_local_queue_and_says_when_estimates_are_missing() -> None:
    from dataclasses import replace

    from edge_agent.policy import LatencyEstimate, ModelRule

    agent = local_agent()
    # no escalation here: explain would run the model for its confidence (see below)
    agent.rules = replace(RULES, models={**RULES.models, "digits-light": ModelRule()})
    x = {"pixels": low_and_high_confidence()[1]}
    decision, _ = agent.explain("digits-light", x, deadline_ms=30)
    assert "no latency estimate yet for the device to weigh against" in decision.message
    local = agent.local_model("digits-light")
    decision, _ = agent.explain("digits-light", x, deadline_ms=30)
    assert "no latency estimate" not in decision.message  # loading timed a first run
    # 10 ms a run, the cloud 5 ms: alone it fits 30 ms; behind 3 running requests it does not
    local.estimate = LatencyEstimate(value=10.0)
    agent.offload = OffloadClient(make_transport("http", "127.0.0.1:9"))  # never called
    agent.offload.costs.observe(  # one offload answered: 3 ms of round trip, 2 ms the gateway's
        "digits-light", raw_bytes=256, sent=300, received=100, total_s=0.005, server_s=0.002
    )
    decision, _ = agent.explain("digits-light", x, deadline_ms=30)
    assert decision.reason == "prefer_local"
    local.running = 3  # as while three other requests run on it
    decision, _ = agent.explain("digits-light", x, deadline_ms=30)
    assert (decision.action, decision.reason) == (Action.OFFLOAD, "deadline_local_too_slow")
    assert "3 ahead" in decision.message
    local.running = 0
    agent.close()


def test_only_the_clouds_answers_are_kept_to_stand_in_for_it(fetched: ModelRepository) -> None:
    """A local answer needs no copy (the local model answers again); hashing each local
    request's input for one would cost ~0.2 ms on an image. The cloud's answers are
    kept (see test_fallback_tiers_cache_then_error)."""
    agent = local_agent(fetched)
    assert agent.infer("digits-light", {"pixels": low_and_high_confidence()[1]}).where == "device"
    picture = np.zeros((1, 128, 128, 3), np.float32)
    assert agent.infer("face-detection-short-range", {"input": picture}).where == "device"
    assert len(agent.cache) == 0
    agent.close()


def test_the_remembered_variant_follows_precision_and_version() -> None:
    from dataclasses import replace

    agent = local_agent()
    try:
        x = {"pixels": low_and_high_confidence()[1]}
        assert agent.infer("digits-light", x).variant == "onnx-int8"  # generic: INT8 first
        agent.prefer_precision("fp32")
        assert agent.infer("digits-light", x).variant == "onnx-fp32"
        # a new version swapped in: the old version's rankings are forgotten
        served = agent.local_model("digits-light").package
        agent.reload("digits-light", replace(served, version=served.version + 1))
        assert agent.infer("digits-light", x).version == served.version + 1
        assert {key[1] for key in agent.models.rankings() if key[0] == "digits-light"} == {
            served.version + 1
        }
    finally:
        agent.close()


def test_explain_runs_the_local_model_when_the_decision_depends_on_its_confidence(
    tmp_path: Path,
) -> None:
    """`policy explain` said LOCAL/prefer_local for a digit the running agent sent to
    the cloud (low_confidence): it now decides as infer does, knowing the confidence."""
    handle = start_gateway(tmp_path, MODELS, poll_interval_s=0.0)
    agent = Agent(
        profile=ProfileStore(PROFILES).get("generic-x86_64"),
        repository=ModelRepository(MODELS),
        rules=RULES,
        offload=OffloadClient(make_transport("grpc", handle.grpc_url, token=handle.device_token)),
        device_state=lambda: DeviceState(),
    )
    try:
        low, high = low_and_high_confidence()
        for pixels, reason in ((low, "low_confidence"), (high, "confident")):
            explained, _ = agent.explain("digits-light", {"pixels": pixels})
            result = agent.infer("digits-light", {"pixels": pixels})
            assert explained.reason == result.decision.reason == reason
            assert explained.details["first"]["reason"] == "prefer_local"
            assert 0 <= explained.details["local_confidence"] <= 1
        # the explains sent nothing: the one escalated infer reached the gateway
        assert metric(handle, "gateway_requests_total") == 1
    finally:
        agent.close()
        handle.thread.stop()
