"""The gateway end to end: real uvicorn and grpc.aio servers on loopback, stock tritonclient."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from tests.support.backends import SlowBackend
from tests.support.gateway import GatewayHandle, registry_in, start_gateway
from tests.support.gateway_calls import (
    direct,
    grpc_infer,
    heldout,
    http_infer,
    http_request,
    metric,
    metric_lines,
    small_repository,
)
from tests.support.paths import MODELS
from tests.support.waiting import wait_for

# -- the protocol, with stock clients ---------------------------------------------------------


def test_health_and_metadata_over_http(gateway: GatewayHandle) -> None:
    client = thttp.InferenceServerClient(gateway.http_url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata(headers=gateway.headers())["name"] == "edge-inference-gateway"
    meta = client.get_model_metadata("digits-heavy", headers=gateway.headers())
    assert meta["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]
    assert meta["versions"] == ["1"] and meta["platform"] == "onnxruntime_onnx"
    assert client.is_model_ready("digits-heavy", headers=gateway.headers())


def test_health_and_metadata_over_grpc(gateway: GatewayHandle) -> None:
    client = tgrpc.InferenceServerClient(gateway.grpc_url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata(headers=gateway.headers()).name == "edge-inference-gateway"
    meta = client.get_model_metadata("digits-light", headers=gateway.headers())
    assert meta.inputs[0].name == "pixels" and list(meta.inputs[0].shape) == [-1, 64]
    assert client.is_model_ready("digits-light", headers=gateway.headers())


@pytest.mark.parametrize("binary", [True, False])
def test_http_infer_matches_a_direct_run(gateway: GatewayHandle, binary: bool) -> None:
    x = heldout()
    assert np.allclose(
        http_infer(gateway, "digits-heavy", x, binary=binary), direct("digits-heavy", x), atol=1e-6
    )


def test_grpc_infer_matches_a_direct_run(gateway: GatewayHandle) -> None:
    x = heldout(5)
    assert np.allclose(grpc_infer(gateway, "digits-light", x), direct("digits-light", x), atol=1e-6)


def test_a_version_can_be_asked_for(gateway: GatewayHandle) -> None:
    x = heldout(2)
    assert np.allclose(
        http_infer(gateway, "digits-heavy", x, model_version="1"),
        direct("digits-heavy", x),
        atol=1e-6,
    )
    with pytest.raises(InferenceServerException, match="has no version '7'"):
        grpc_infer(gateway, "digits-heavy", x, model_version="7")


def test_whole_image_model_is_served(gateway: GatewayHandle) -> None:
    image = np.random.default_rng(0).uniform(-1, 1, (1, 3, 64, 96)).astype(np.float32)
    client = tgrpc.InferenceServerClient(gateway.grpc_url)
    tensor = tgrpc.InferInput("x", list(image.shape), "FP32")
    tensor.set_data_from_numpy(image)
    result = client.infer("ppocr-det", [tensor], headers=gateway.headers())
    assert result.as_numpy("sigmoid_0.tmp_0").shape == (1, 1, 64, 96)


# -- authentication ---------------------------------------------------------------------------


@pytest.mark.slow
def test_missing_wrong_and_revoked_tokens(tmp_path: Path) -> None:
    handle = start_gateway(tmp_path, small_repository(tmp_path), poll_interval_s=0.0)
    try:
        x = heldout(1)
        body = json.dumps(
            {
                "inputs": [
                    {
                        "name": "pixels",
                        "datatype": "FP32",
                        "shape": [1, 64],
                        "data": x.ravel().tolist(),
                    }
                ]
            }
        ).encode()
        path = "/v2/models/digits-light/infer"
        assert http_request(handle.http_url, path, body) == (
            401,
            {"error": "missing bearer token (Authorization: Bearer <token>)"},
        )
        assert http_request(
            handle.http_url, path, body, {"authorization": "Bearer cam-01.forged"}
        ) == (
            401,
            {"error": "invalid token"},
        )
        status, _ = http_request(handle.http_url, path, body, handle.headers())
        assert status == 200
        channel_client = tgrpc.InferenceServerClient(handle.grpc_url)
        with pytest.raises(InferenceServerException) as info:
            channel_client.get_model_metadata(
                "digits-light", headers={"authorization": "Bearer nope.x"}
            )
        assert info.value.status() == "StatusCode.UNAUTHENTICATED"
        registry_in(handle.state_dir).revoke("cam-01")
        time.sleep(1.1)  # the gateway re-reads the registry at most once a second
        assert http_request(handle.http_url, path, body, handle.headers()) == (
            401,
            {"error": "device 'cam-01' is revoked"},
        )
        with pytest.raises(InferenceServerException, match="revoked") as info:
            grpc_infer(handle, "digits-light", x)
        assert info.value.status() == "StatusCode.UNAUTHENTICATED"
        # health stays open
        assert http_request(handle.http_url, "/v2/health/ready")[0] == 200
        assert tgrpc.InferenceServerClient(handle.grpc_url).is_server_live()
    finally:
        handle.thread.stop()


# -- bad input --------------------------------------------------------------------------------


def post(
    handle: GatewayHandle, path: str, document: Any, extra: dict[str, str] | None = None
) -> tuple[int, Any]:
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    return http_request(handle.http_url, path, body, {**handle.headers(), **(extra or {})})


def pixels(**fields: Any) -> dict[str, Any]:
    return {"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64, **fields}


@pytest.mark.parametrize(
    ("document", "status", "message"),
    [
        (b"{not json", 400, "the request body is not valid JSON"),
        (
            {"inputs": [pixels(datatype="FP64")]},
            400,
            "input 'pixels': datatype FP64, expected FP32",
        ),
        (
            {"inputs": [pixels(shape=[1, 65])]},
            400,
            "'data' has 64 elements but shape [1, 65] needs 65",
        ),
        (
            {"inputs": [pixels(shape=[2, 32])]},
            400,
            "input 'pixels': shape [2, 32], expected [?, 64]",
        ),
        (
            {"inputs": [pixels(name="image")]},
            400,
            "missing input 'pixels' for model 'digits-light'",
        ),
        (
            {"inputs": [pixels(), pixels(name="extra")]},
            400,
            "unknown input 'extra' for model 'digits-light'",
        ),
        ({"inputs": [pixels()], "outputs": [{"name": "logits"}]}, 400, "unknown output 'logits'"),
        ({"inputs": [pixels(datatype="COMPLEX")]}, 400, "unknown datatype 'COMPLEX'"),
        ({"inputs": "pixels"}, 400, "'inputs' must be a non-empty list"),
    ],
)
def test_bad_http_requests(
    gateway: GatewayHandle, document: Any, status: int, message: str
) -> None:
    got_status, body = post(gateway, "/v2/models/digits-light/infer", document)
    assert got_status == status
    assert set(body) == {"error"} and message in body["error"]


def test_unknown_model_and_version_over_http(gateway: GatewayHandle) -> None:
    status, body = post(gateway, "/v2/models/nope/infer", {"inputs": [pixels()]})
    assert (status, body) == (404, {"error": "unknown model 'nope'"})
    status, body = post(gateway, "/v2/models/digits-light/versions/9/infer", {"inputs": [pixels()]})
    assert status == 404 and "has no version '9'" in body["error"]
    status, body = http_request(gateway.http_url, "/v2/models/nope", headers=gateway.headers())
    assert status == 404
    status, body = http_request(gateway.http_url, "/v2/no/such/route", headers=gateway.headers())
    assert status == 404 and "error" in body


def grpc_status(call: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.status()), str(info.value.message())


def test_bad_grpc_requests(gateway: GatewayHandle) -> None:
    client = tgrpc.InferenceServerClient(gateway.grpc_url)
    wrong_type = tgrpc.InferInput("pixels", [1, 64], "FP64")
    wrong_type.set_data_from_numpy(np.zeros((1, 64), np.float64))
    assert grpc_status(
        lambda: client.infer("digits-light", [wrong_type], headers=gateway.headers())
    ) == (
        "StatusCode.INVALID_ARGUMENT",
        "input 'pixels': datatype FP64, expected FP32",
    )
    wrong_name = tgrpc.InferInput("image", [1, 64], "FP32")
    wrong_name.set_data_from_numpy(np.zeros((1, 64), np.float32))
    code, message = grpc_status(
        lambda: client.infer("digits-light", [wrong_name], headers=gateway.headers())
    )
    assert code == "StatusCode.INVALID_ARGUMENT" and "missing input 'pixels'" in message
    good = tgrpc.InferInput("pixels", [1, 64], "FP32")
    good.set_data_from_numpy(np.zeros((1, 64), np.float32))
    code, message = grpc_status(lambda: client.infer("nope", [good], headers=gateway.headers()))
    assert (code, message) == ("StatusCode.NOT_FOUND", "unknown model 'nope'")


def test_mismatched_raw_contents_and_malformed_protobuf(gateway: GatewayHandle) -> None:
    from edge_core.protocol.grpc import pb

    channel = grpc.insecure_channel(gateway.grpc_url)
    metadata = [("authorization", f"Bearer {gateway.device_token}")]
    message = pb().ModelInferRequest(model_name="digits-light")
    message.inputs.add(name="pixels", datatype="FP32", shape=[1, 64])
    message.raw_input_contents.append(b"\x00" * 100)
    infer = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
        response_deserializer=pb().ModelInferResponse.FromString,
    )
    with pytest.raises(grpc.RpcError) as info:
        infer(message, metadata=metadata, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "100 bytes of data for shape [1, 64] and datatype FP32 (256 expected)"
        in info.value.details()
    )
    with pytest.raises(grpc.RpcError) as info:
        infer(b"\xff\xff\xff\xff garbage", metadata=metadata, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed protobuf request" in info.value.details()
    channel.close()


# -- limits ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_body_size_limit(tmp_path: Path) -> None:
    handle = start_gateway(
        tmp_path, small_repository(tmp_path), max_body_bytes=4096, poll_interval_s=0.0
    )
    try:
        x = np.zeros((32, 64), np.float32)  # 8 KiB of tensor data
        with pytest.raises(InferenceServerException) as info:
            http_infer(handle, "digits-light", x)
        assert info.value.status() == "413" and "exceeds the limit of 4096 bytes" in str(
            info.value.message()
        )
        with pytest.raises(InferenceServerException) as info:
            grpc_infer(handle, "digits-light", x)
        assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert http_infer(handle, "digits-light", x[:2]).shape == (2, 10)
    finally:
        handle.thread.stop()


def test_rate_limit_per_device(tmp_path: Path) -> None:
    from cloud_gateway.config import RateLimitSettings

    handle = start_gateway(
        tmp_path,
        small_repository(tmp_path),
        rate_limit=RateLimitSettings(requests_per_second=0.01, burst=2),  # no refill meanwhile
        poll_interval_s=0.0,
    )
    try:
        x = heldout(1)
        http_infer(handle, "digits-light", x)
        grpc_infer(handle, "digits-light", x)
        with pytest.raises(InferenceServerException) as info:
            http_infer(handle, "digits-light", x)
        assert info.value.status() == "429" and "rate limit of 0.01 requests/s exceeded" in str(
            info.value.message()
        )
        with pytest.raises(InferenceServerException) as info:
            grpc_infer(handle, "digits-light", x)
        assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        admin = {"authorization": f"Bearer {handle.admin_token}"}
        assert (
            http_request(handle.http_url, "/v2", headers=admin)[0] == 200
        )  # another device is not limited
    finally:
        handle.thread.stop()


# -- batching -----------------------------------------------------------------------------------


def test_concurrent_requests_end_up_in_one_batch_and_a_bad_one_fails_alone(tmp_path: Path) -> None:
    from cloud_gateway.config import BatchingSettings

    handle = start_gateway(
        tmp_path,
        small_repository(tmp_path),
        # the batch goes when its 7 good rows are in (a full batch does not wait), however
        # slowly the 8 client threads start
        batching=BatchingSettings(max_batch_size=7, max_queue_delay_us=10_000_000),
        poll_interval_s=0.0,
    )
    try:
        x = heldout(8)

        def one(i: int) -> Any:
            if i == 3:
                bad = np.zeros((1, 63), np.float32)
                try:
                    return grpc_infer(handle, "digits-light", bad)
                except InferenceServerException as exc:
                    return exc
            return grpc_infer(handle, "digits-light", x[i : i + 1])

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(8)))
        assert isinstance(results[3], InferenceServerException)
        assert results[3].status() == "StatusCode.INVALID_ARGUMENT"
        expected = direct("digits-light", x)
        for i, result in enumerate(results):
            if i != 3:
                assert np.allclose(result, expected[i : i + 1], atol=1e-6)
        assert metric(handle, "gateway_batch_size_count", model="digits-light") == 1
        assert metric(handle, "gateway_batch_size_sum", model="digits-light") == 7
    finally:
        handle.thread.stop()


@pytest.mark.slow
def test_a_requests_deadline_is_kept(tmp_path: Path) -> None:
    handle = start_gateway(
        tmp_path, small_repository(tmp_path), backend=SlowBackend(0.5), poll_interval_s=0.0
    )
    try:
        x = heldout(1)
        with ThreadPoolExecutor(1) as pool:
            busy = pool.submit(http_infer, handle, "digits-light", x)  # occupies the model
            time.sleep(0.1)
            started = time.monotonic()
            with pytest.raises(InferenceServerException) as info:
                http_infer(handle, "digits-light", x, timeout=100_000)  # 100 ms, in microseconds
            waited = time.monotonic() - started
            assert busy.result().shape == (1, 10)
        assert info.value.status() == "504" and "deadline passed" in str(info.value.message())
        assert waited < 0.6  # not after the busy run and its own (~0.9 s)
        code, _ = grpc_status(lambda: grpc_infer(handle, "digits-light", x, client_timeout=0.1))
        assert code == "StatusCode.DEADLINE_EXCEEDED"
    finally:
        handle.thread.stop()


@pytest.mark.slow
def test_a_grpc_call_ended_early_is_counted(tmp_path: Path) -> None:
    """gRPC ends a call at its deadline, or when the client cancels it, by cancelling
    the handler (whichever of that and the data plane's own deadline comes first):
    each request is counted all the same, under what ended it."""
    from tritonclient.grpc import service_pb2 as pb

    from edge_core.protocol.grpc import request_to_proto
    from edge_core.protocol.types import InferRequest

    handle = start_gateway(
        tmp_path, small_repository(tmp_path), backend=SlowBackend(1.5), poll_interval_s=0.0
    )
    x = heldout(1)
    request = request_to_proto(
        InferRequest(inputs={"pixels": x}, datatypes={"pixels": "FP32"}, model_name="digits-light")
    )
    channel = grpc.insecure_channel(handle.grpc_url)
    infer = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    metadata = tuple(handle.headers().items())

    def arrived() -> float:
        return metric(handle, "gateway_device_requests_total")

    try:
        # connected first, so that no call's deadline is spent connecting (a call that
        # never reached the gateway is not the gateway's to count)
        grpc.channel_ready_future(channel).result(timeout=10)
        for _ in range(3):  # past the deadline while the model runs (or waits for it)
            with pytest.raises(grpc.RpcError) as info:
                infer(request, timeout=0.3, metadata=metadata)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_for(lambda: arrived() == 3)
        call = infer.future(request, timeout=5, metadata=metadata)
        wait_for(lambda: arrived() == 4)  # given up on once the gateway has it
        assert call.cancel()

        def counted(status: str) -> float:
            return metric(handle, "gateway_requests_total", protocol="grpc", status=status)

        try:
            wait_for(lambda: counted("deadline_exceeded") == 3 and counted("cancelled") == 1)
        except AssertionError:
            raise AssertionError(metric_lines(handle, "gateway_requests_total")) from None
        assert metric(handle, "gateway_requests_total", protocol="grpc") == 4
        assert metric(handle, "gateway_request_failures_total", status="cancelled") == 1
    finally:
        channel.close()
        handle.thread.stop()


# -- the repository --------------------------------------------------------------------------------


@pytest.mark.slow
def test_models_reload_on_change_without_a_restart(tmp_path: Path) -> None:
    repository = small_repository(tmp_path)
    handle = start_gateway(tmp_path, repository, poll_interval_s=0.1)
    try:
        client = thttp.InferenceServerClient(handle.http_url)
        x = heldout(4)
        light = direct("digits-light", x)
        heavy = direct("digits-heavy", x)
        # a new version appears: it is served by default, the old one on request
        v2 = repository / "digits-light" / "2"
        shutil.copytree(MODELS / "digits-heavy" / "1", v2)
        manifest = json.loads((v2 / "manifest.json").read_text())
        manifest.update(name="digits-light", version=2)
        (v2 / "manifest.json").write_text(json.dumps(manifest))
        wait_for(
            lambda: (
                client.get_model_metadata("digits-light", headers=handle.headers())["versions"]
                == ["1", "2"]
            )
        )
        assert np.allclose(http_infer(handle, "digits-light", x), heavy, atol=1e-6)
        assert np.allclose(
            http_infer(handle, "digits-light", x, model_version="1"), light, atol=1e-6
        )
        # version 2 changes in place: reloaded
        for name in ("manifest.json", "model.fp32.onnx"):
            shutil.copy(MODELS / "digits-light" / "1" / name, v2 / name)
        manifest = json.loads((v2 / "manifest.json").read_text())
        manifest["version"] = 2
        (v2 / "manifest.json").write_text(json.dumps(manifest))
        wait_for(lambda: np.allclose(http_infer(handle, "digits-light", x), light, atol=1e-6))
        # version 2 goes away: unloaded
        shutil.rmtree(v2)
        wait_for(
            lambda: (
                client.get_model_metadata("digits-light", headers=handle.headers())["versions"]
                == ["1"]
            )
        )
        # a broken version does not disturb what is served
        broken = repository / "digits-light" / "3"
        broken.mkdir()
        (broken / "manifest.json").write_text("{}")
        admin = {"authorization": f"Bearer {handle.admin_token}"}

        def index_states() -> dict[tuple[str, str], Any]:
            _, index = http_request(handle.http_url, "/v2/repository/index", b"", admin)
            return {(m["name"], m["version"]): m for m in index}

        def tried() -> bool:  # the poller has seen it and tried to load it
            state = index_states().get(("digits-light", "3"), {}).get("state")
            return state not in (None, "LOADING")

        wait_for(tried)
        assert np.allclose(http_infer(handle, "digits-light", x), light, atol=1e-6)
        states = index_states()
        assert states[("digits-light", "3")]["state"] == "UNAVAILABLE"
        assert "name: missing" in states[("digits-light", "3")]["reason"]
    finally:
        handle.thread.stop()


def test_repository_api_needs_an_admin(tmp_path: Path) -> None:
    handle = start_gateway(tmp_path, small_repository(tmp_path), poll_interval_s=0.0)
    try:
        admin = {"authorization": f"Bearer {handle.admin_token}"}
        path = "/v2/repository/models/digits-light/unload"
        status, body = http_request(handle.http_url, path, b"", handle.headers())
        assert status == 403 and "may not manage the repository" in body["error"]
        assert http_request(handle.http_url, path, b"", admin)[0] == 200
        with pytest.raises(InferenceServerException, match="unknown model 'digits-light'"):
            http_infer(handle, "digits-light", heldout(1))
        client = tgrpc.InferenceServerClient(handle.grpc_url)
        client.load_model("digits-light", headers=admin)
        assert http_infer(handle, "digits-light", heldout(1)).shape == (1, 10)
        index = client.get_model_repository_index(headers=admin)
        assert [(m.name, m.state) for m in index.models] == [("digits-light", "READY")]
    finally:
        handle.thread.stop()


# -- metrics -----------------------------------------------------------------------------------------


def test_metrics_count_requests_failures_devices_and_latency(tmp_path: Path) -> None:
    handle = start_gateway(tmp_path, small_repository(tmp_path), poll_interval_s=0.0)
    try:
        x = heldout(2)
        for _ in range(3):
            http_infer(handle, "digits-light", x)
        grpc_infer(handle, "digits-light", x)
        post(handle, "/v2/models/digits-light/infer", {"inputs": [pixels(datatype="FP64")]})
        assert (
            metric(
                handle, "gateway_requests_total", model="digits-light", protocol="http", status="ok"
            )
            == 3
        )
        assert (
            metric(
                handle, "gateway_requests_total", model="digits-light", protocol="grpc", status="ok"
            )
            == 1
        )
        assert (
            metric(
                handle, "gateway_request_failures_total", model="digits-light", status="bad_request"
            )
            == 1
        )
        assert (
            metric(handle, "gateway_device_requests_total", device="cam-01", group="rpi5-int8") == 4
        )
        assert metric(handle, "gateway_request_seconds_count", model="digits-light") == 4
        assert metric(handle, "gateway_queue_seconds_count", model="digits-light") == 4
        assert metric(handle, "gateway_compute_seconds_count", model="digits-light") >= 1
        assert (
            metric(handle, "gateway_model_loaded", model="digits-light", variant="onnx-fp32") == 1
        )
    finally:
        handle.thread.stop()


@pytest.mark.slow
def test_metrics_need_a_token_by_default_and_survive_a_reload(tmp_path: Path) -> None:
    repository = small_repository(tmp_path)
    handle = start_gateway(tmp_path, repository, poll_interval_s=0.1)
    try:
        assert http_request(handle.http_url, "/metrics")[0] == 401  # it names the fleet's devices
        assert metric(handle, "gateway_model_loaded", model="digits-light") == 1
        manifest = repository / "digits-light" / "1" / "manifest.json"
        manifest.write_text(manifest.read_text())  # touched: reloaded in place
        time.sleep(0.6)
        assert metric(handle, "gateway_model_loaded", model="digits-light") == 1
        x = heldout(1)
        for name in ("junk-a", "junk-b"):
            with pytest.raises(InferenceServerException):
                http_infer(handle, name, x)
        assert metric(handle, "gateway_requests_total", model="unknown", status="not_found") == 2
        _, text = http_request(
            handle.http_url, "/metrics", headers=handle.headers(handle.admin_token)
        )
        assert b"junk-a" not in text  # client-chosen names make no series
        post(
            handle,
            "/v2/models/digits-light/infer",
            {"inputs": [pixels()]},
            {"authorization": "Bearer nope"},
        )
        assert (
            metric(
                handle,
                "gateway_request_failures_total",
                model="digits-light",
                status="unauthenticated",
            )
            == 1
        )
    finally:
        handle.thread.stop()


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "message"),
    [
        # a malformed version is a 400 (one that is not loaded, a 404)
        (
            "/v2/models/digits-light/versions/%C2%B2",
            None,
            {},
            400,
            "expected a decimal integer from 1",
        ),
        (
            "/v2/models/digits-light/infer",
            b"{}",
            {"Inference-Header-Content-Length": "\xb2"},
            400,
            "must be a non-negative integer",
        ),
        ("/v2/models/digits-light/infer", b"[" * 100_000, {}, 400, "nested too deeply"),
        (
            "/v2/models/digits-light/infer",
            json.dumps({"inputs": [pixels(shape=[1] * 65, data=[0.0])]}).encode(),
            {},
            400,
            "at most 32",
        ),
        (
            "/v2/models/digits-light/infer",
            json.dumps({"inputs": [pixels(shape=[0, 2**64], data=[])]}).encode(),
            {},
            400,
            "too large",
        ),
    ],
)
def test_inputs_that_once_gave_a_500(
    gateway: GatewayHandle,
    path: str,
    body: bytes | None,
    headers: dict[str, str],
    status: int,
    message: str,
) -> None:
    got, document = http_request(gateway.http_url, path, body, {**gateway.headers(), **headers})
    assert got == status and message in document["error"]


def test_grpc_unicode_version_is_malformed(gateway: GatewayHandle) -> None:
    client = tgrpc.InferenceServerClient(gateway.grpc_url)
    code, message = grpc_status(
        lambda: client.get_model_metadata("digits-light", "²", headers=gateway.headers())
    )
    assert code == "StatusCode.INVALID_ARGUMENT" and "expected a decimal integer" in message


def test_the_fast_inference_path_answers_as_the_fastapi_route(gateway: GatewayHandle) -> None:
    """uvicorn's inference requests are answered ahead of FastAPI (InferFront); the
    application's own route, which the OpenAPI document describes, answers alike."""
    import httpx

    from cloud_gateway.rest.infer import InferFront

    served_app = gateway.gateway._http.config.app  # type: ignore[union-attr]
    assert isinstance(served_app, InferFront) and served_app.app is gateway.gateway.app

    x = heldout(2)
    binary_body = (
        json.dumps(
            {
                "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [2, 64],
                            "parameters": {"binary_data_size": x.nbytes}}],
                "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}],
            }
        ).encode()
    )  # fmt: skip
    header_length = str(len(binary_body))
    binary_body += x.tobytes()
    token = gateway.headers()
    cases: list[tuple[str, bytes, dict[str, str]]] = [
        ("/v2/models/digits-heavy/infer", json.dumps({"inputs": [pixels()]}).encode(), token),
        (
            "/v2/models/digits-heavy/versions/1/infer",
            binary_body,
            {**token, "Inference-Header-Content-Length": header_length, "X-Request-Id": "r-1"},
        ),
        ("/v2/models/digits-heavy/infer", b"{not json", token),
        ("/v2/models/digits-heavy/infer", json.dumps({"inputs": [pixels()]}).encode(), {}),
        ("/v2/models/nope/infer", json.dumps({"inputs": [pixels()]}).encode(), token),
        ("/v2/models/digits-heavy/versions/9/infer", b'{"inputs": []}', token),
        (
            "/v2/models/digits-heavy/versions/9/infer",
            json.dumps({"inputs": [pixels()]}).encode(),
            token,
        ),
        ("/v2/models/digits-heavy/infer", b"x", {**token, "Inference-Header-Content-Length": "9"}),
    ]

    async def bare(path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict, bytes]:
        transport = httpx.ASGITransport(app=gateway.gateway.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            answer = await client.post(path, content=body, headers=headers)
        return answer.status_code, dict(answer.headers), answer.content

    statuses = []
    keys = ("content-type", "inference-header-content-length", "x-request-id", "www-authenticate")
    for path, body, headers in cases:
        request = urllib.request.Request(
            f"http://{gateway.http_url}{path}", data=body, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                served = (response.status, dict(response.headers), response.read())
        except urllib.error.HTTPError as error:
            served = (error.code, dict(error.headers), error.read())
        routed = gateway.thread.call(bare(path, body, headers))
        statuses.append(served[0])
        assert served[0] == routed[0], path
        assert served[2] == routed[2], path
        for key in keys:
            assert {k.lower(): v for k, v in served[1].items()}.get(key) == routed[1].get(key), key
    assert statuses == [200, 200, 400, 401, 404, 400, 404, 400]
