"""The remote backend: models run by another engine behind the gateway.

Two real engines: MLServer 1.7.1 (a third party, in its own environment, with a
custom ONNX Runtime runtime) and a second gateway. The front gateway keeps the
device's token, the checks against the model's metadata and the deadline; the
engine's answers, errors and health come through the one status table.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from cloud_gateway.config import BackendSettings, load_config
from cloud_gateway.server import GatewayThread
from edge_core.errors import ConfigError
from tests.support.backends import SlowBackend
from tests.support.engines import MLServer
from tests.support.gateway import GatewayHandle, start_gateway
from tests.support.gateway_calls import direct, heldout, http_request
from tests.support.paths import MODELS
from tests.support.waiting import wait_for


def backend(url: str, **fields: object) -> BackendSettings:
    """A ``[[backends]]`` entry as the configuration file gives it."""
    scheme, _, rest = url.partition("://")
    protocol = "grpc" if scheme == "grpc" else "http"
    settings = BackendSettings(
        url=url, protocol=protocol, address=rest if protocol == "grpc" else url, name="engine"
    )
    return dataclasses.replace(settings, **fields)  # type: ignore[arg-type]


def heavy_only(tmp: Path) -> Path:
    """A repository with digits-heavy alone (loads in a moment)."""
    repo = tmp / "heavy-repo"
    if not repo.exists():
        repo.mkdir(parents=True)
        (repo / "digits-heavy").symlink_to(MODELS / "digits-heavy")
    return repo


def token_file(tmp: Path, token: str) -> Path:
    path = tmp / "engine.token"
    path.write_text(token)
    os.chmod(path, 0o600)
    return path


def grpc_infer(handle: GatewayHandle, x: np.ndarray, **kwargs: object) -> np.ndarray:
    client = tgrpc.InferenceServerClient(handle.grpc_url)
    tensor = tgrpc.InferInput("pixels", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    answer = client.infer("digits-heavy", [tensor], headers=handle.headers(), **kwargs)
    return answer.as_numpy("probabilities")


def http_infer(handle: GatewayHandle, x: np.ndarray) -> np.ndarray:
    client = thttp.InferenceServerClient(handle.http_url)
    tensor = thttp.InferInput("pixels", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer("digits-heavy", [tensor], headers=handle.headers()).as_numpy(
        "probabilities"
    )


# -- configuration ---------------------------------------------------------------------------


def test_backends_are_read_from_the_configuration(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(
        'repository = "models"\n'
        '[[backends]]\nurl = "grpc://engine:8001"\nmodels = ["digits-heavy"]\nmax_in_flight = 8\n'
        '[[backends]]\nurl = "https://triton.example/"\nname = "triton"\ntimeout_s = 5\n'
        'forward_parameters = ["sequence_id"]\n'
    )
    config = load_config(path)
    first, second = config.backends
    assert (first.protocol, first.address, first.models, first.max_in_flight) == (
        "grpc",
        "engine:8001",
        ("digits-heavy",),
        8,
    )
    assert (second.protocol, second.address, second.name, second.models) == (
        "http",
        "https://triton.example",
        "triton",
        None,
    )
    assert second.tls is not None  # https: the system's CAs
    assert (first.forward_parameters, second.forward_parameters) == ((), ("sequence_id",))


@pytest.mark.parametrize(
    ("entry", "field", "message"),
    [
        ('url = "tcp://engine:1"', "backends[0].url", "grpc://"),
        ('url = "grpc://e:1"\nmodels = "some"', "backends[0].models", '"all"'),
        ('url = "grpc://e:1"\nmax_in_flight = 0', "backends[0].max_in_flight", ">= 1"),
        ('url = "grpc://e:1"\nmax_inflight = 3', "backends[0].max_inflight", "max_in_flight"),
        ('url = "grpc://e:1"\n[backends.tls]\nca = "ca.pem"', "backends[0].tls", "grpcs://"),
        (
            'url = "grpc://e:1"\nforward_parameters = "all"',
            "backends[0].forward_parameters",
            "a list of strings",
        ),
    ],
)
def test_a_wrong_backend_entry_fails_at_start(
    tmp_path: Path, entry: str, field: str, message: str
) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(f'repository = "models"\n[[backends]]\n{entry}\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.field == field
    assert message in str(caught.value)


# -- MLServer, a third-party engine ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_mlserver_models_are_served_through_the_gateway(
    tmp_path: Path,
    mlserver: MLServer,
    protocol: str,
) -> None:
    empty = tmp_path / "repo"
    empty.mkdir()
    front = start_gateway(
        tmp_path, empty, poll_interval_s=0.0, backends=(backend(mlserver.url(protocol)),)
    )
    try:
        x = heldout(4)
        expected = direct("digits-heavy", x)
        # every model the engine's index lists, with the metadata the engine gives
        client = tgrpc.InferenceServerClient(front.grpc_url)
        meta = client.get_model_metadata("digits-heavy", headers=front.headers(), as_json=True)
        assert meta["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": ["-1", "64"]}]
        assert client.is_model_ready("digits-heavy", headers=front.headers())
        np.testing.assert_allclose(grpc_infer(front, x), expected, atol=1e-5)
        np.testing.assert_allclose(http_infer(front, x), expected, atol=1e-5)
        # the gateway's own checks stay: a wrong shape never reaches the engine
        status, body = http_request(
            front.http_url,
            "/v2/models/digits-heavy/infer",
            b'{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}',
            front.headers(),
        )
        assert status == 400
        assert "expected [?, 64]" in str(body)
        # and the device's token
        status, _ = http_request(front.http_url, "/v2/models/digits-heavy/ready")
        assert status == 401
        # no double batching: the engine batches, the gateway forwards
        assert front.gateway.plane._batchers == {}
        index = front.gateway.repository.index()
        assert index == [{"name": "digits-heavy", "version": "1", "state": "READY"}]
    finally:
        front.thread.stop()


# -- a second gateway as the engine ------------------------------------------------------------


@pytest.fixture
def engine(tmp_path: Path) -> GatewayHandle:
    """A gateway that serves digits-heavy slowly (0.3 s a request), unbatched."""
    from cloud_gateway.config import BatchingSettings

    handle = start_gateway(
        tmp_path / "engine",
        heavy_only(tmp_path),
        SlowBackend(0.3),
        poll_interval_s=0.0,
        workers=4,
        batching=BatchingSettings(enabled=False),
    )
    yield handle
    handle.thread.stop()


def front_of(tmp: Path, engine: GatewayHandle, protocol: str, **fields: object) -> GatewayHandle:
    url = f"grpc://{engine.grpc_url}" if protocol == "grpc" else f"http://{engine.http_url}"
    settings = backend(
        url,
        models=("digits-heavy",),
        token_file=token_file(tmp, engine.admin_token),
        health_interval_s=0.1,
        connect_timeout_s=0.5,
        **fields,
    )
    empty = tmp / "front-repo"
    empty.mkdir(exist_ok=True)
    return start_gateway(tmp / "front", empty, poll_interval_s=0.0, backends=(settings,))


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_deadline_reaches_the_engine(
    tmp_path: Path, engine: GatewayHandle, protocol: str
) -> None:
    front = front_of(tmp_path, engine, protocol)
    try:
        x = heldout(1)
        assert grpc_infer(front, x).shape == (1, 10)
        # (how soon the caller hears is its own client's doing: gRPC ends the call at
        # its deadline whatever the servers do; what the servers do is below)
        with pytest.raises(InferenceServerException) as caught:
            grpc_infer(front, x, client_timeout=0.1)
        assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        # the engine was told: it gave up too (gRPC deadline, or the protocol's timeout)
        labels = ("digits-heavy", protocol, "deadline_exceeded")
        failures = engine.gateway.metrics.requests.labels(*labels)
        wait_for(lambda: failures._value.get() >= 1)
    finally:
        front.thread.stop()


@pytest.mark.slow
def test_the_engines_errors_map_to_the_status_table(tmp_path: Path, engine: GatewayHandle) -> None:
    front = front_of(tmp_path, engine, "grpc", max_in_flight=1)
    try:
        x = heldout(1)
        # more than max_in_flight at once: the one past it waits within its deadline,
        # then is told the engine is full (UNAVAILABLE, which the agent retries)
        results: list[str] = []

        def call(timeout: float) -> None:
            try:
                grpc_infer(front, x, client_timeout=timeout)
                results.append("ok")
            except InferenceServerException as exc:
                results.append(str(exc.status()))

        first = threading.Thread(target=call, args=(2.0,))
        first.start()
        time.sleep(0.1)
        call(0.18)  # gives up waiting at 0.26 s, before the first is answered
        first.join()
        assert sorted(results) == ["StatusCode.UNAVAILABLE", "ok"]
        # the engine stops serving the model: its NOT_FOUND is ours
        admin = tgrpc.InferenceServerClient(engine.grpc_url)
        admin.unload_model("digits-heavy", headers=engine.headers(engine.admin_token))
        with pytest.raises(InferenceServerException) as caught:
            grpc_infer(front, x)
        assert caught.value.status() == "StatusCode.NOT_FOUND"
        assert "engine engine" in caught.value.message()
    finally:
        front.thread.stop()


@pytest.mark.slow
def test_an_engine_that_goes_down_makes_its_models_unready(tmp_path: Path) -> None:
    from cloud_gateway.config import BatchingSettings

    engine = start_gateway(
        tmp_path / "engine",
        heavy_only(tmp_path),
        poll_interval_s=0.0,
        batching=BatchingSettings(enabled=False),
    )
    config = engine.gateway.config
    front = front_of(tmp_path, engine, "grpc")
    try:
        x = heldout(1)
        assert grpc_infer(front, x).shape == (1, 10)
        assert http_request(front.http_url, "/v2/health/ready")[0] == 200
        engine.thread.stop()
        wait_for(lambda: http_request(front.http_url, "/v2/health/ready")[0] == 503)
        _, body = http_request(front.http_url, "/v2/health/ready")
        assert "engine engine is down" in str(body)
        client = tgrpc.InferenceServerClient(front.grpc_url)
        assert not client.is_model_ready("digits-heavy", headers=front.headers())
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as caught:
            grpc_infer(front, x)
        assert caught.value.status() == "StatusCode.UNAVAILABLE"
        assert time.monotonic() - started < 0.5  # at once, no connection attempt
        # the engine comes back on its port (its state kept): so do its models
        engine.thread = GatewayThread(
            dataclasses.replace(config, grpc_port=engine.gateway.grpc_port, http_port=0)
        )
        wait_for(lambda: http_request(front.http_url, "/v2/health/ready")[0] == 200)
        assert grpc_infer(front, x).shape == (1, 10)
    finally:
        front.thread.stop()
        engine.thread.stop()


def test_the_grpc_status_of_an_engine_error() -> None:
    from edge_core.errors import EngineError, EngineUnavailable
    from edge_core.status import status_of

    assert (status_of(EngineError("x")).http, status_of(EngineError("x")).grpc) == (
        502,
        "INTERNAL",
    )
    assert status_of(EngineUnavailable("x")).grpc == grpc.StatusCode.UNAVAILABLE.name


def test_the_engine_http_client_reads_chunked_answers_and_reconnects() -> None:
    """A real server on loopback: a chunked answer, then the connection closed at the
    server's end (a keep-alive timeout): the next request goes on a fresh one."""
    import asyncio

    from cloud_gateway.remote.http1 import Client, TimedOut

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if served.append(1) or len(served) == 3:
            return  # never answers
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")  # fmt: skip
        await writer.drain()
        writer.close()  # then closes the kept-alive connection

    async def run() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = Client(f"http://127.0.0.1:{port}", size=2)
        for _ in range(2):
            answer = await client.request("GET", "/x", timeout=2)
            assert (answer.status, answer.body) == (200, b"hello world")
        with pytest.raises(TimedOut):
            await client.request("GET", "/x", timeout=0.2)
        await client.close()
        server.close()

    served: list[int] = []
    asyncio.run(run())
    assert len(served) == 3


@pytest.mark.slow
def test_binary_tensors_pass_through_to_an_http_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device's binary request goes to an HTTP engine with its tensor bytes as they
    came (only the JSON header written again), and the engine's binary answer comes
    back as it is; an answer in another form than the device asked is encoded again."""
    import edge_core.protocol.rest as rest

    engine = start_gateway(tmp_path / "engine", heavy_only(tmp_path), poll_interval_s=0.0)
    front = front_of(tmp_path, engine, "http")
    forwarded: list[bytes] = []
    encoded: list[str] = []
    forward, tensors = rest.forward_infer_request, rest._tensors

    def spy_forward(raw: object, parameters: dict[str, object]) -> object:
        parts, length = forward(raw, parameters)  # type: ignore[arg-type]
        forwarded.append(bytes(parts[1]))
        return parts, length

    def spy_tensors(arrays: object, datatypes: object, binary: object, kind: str) -> object:
        encoded.append(kind)
        return tensors(arrays, datatypes, binary, kind)  # type: ignore[arg-type]

    monkeypatch.setattr(rest, "forward_infer_request", spy_forward)
    monkeypatch.setattr(rest, "_tensors", spy_tensors)
    try:
        x = heldout(2)
        expected = direct("digits-heavy", x)
        np.testing.assert_allclose(http_infer(front, x), expected, atol=1e-5)
        assert forwarded == [x.tobytes()]  # the very bytes the device sent
        assert encoded == ["output"]  # the engine's own answer; the front relayed it
        # outputs asked for as JSON: the engine is still asked for binary (cheaper to
        # read), and the front encodes the JSON the device wants
        client = thttp.InferenceServerClient(front.http_url)
        tensor = thttp.InferInput("pixels", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        wanted = [thttp.InferRequestedOutput("probabilities", binary_data=False)]
        encoded.clear()
        answer = client.infer("digits-heavy", [tensor], outputs=wanted, headers=front.headers())
        np.testing.assert_allclose(answer.as_numpy("probabilities"), expected, atol=1e-5)
        assert len(forwarded) == 2 and encoded == ["output", "output"]
    finally:
        front.thread.stop()
        engine.thread.stop()


def test_an_answer_is_relayed_only_when_it_says_what_the_gateway_would() -> None:
    from types import SimpleNamespace

    from cloud_gateway.dataplane import DataPlane
    from edge_core.protocol.types import InferRequest, InferResponse, RawAnswer

    raw = RawAnswer(b"{}", 2, frozenset())
    model = SimpleNamespace(package=SimpleNamespace(name="m", version=3))
    request = InferRequest({}, {}, id="r")

    def relayed(name: str, version: str, id: str) -> RawAnswer | None:
        answer = InferResponse(name, version, {}, id=id, raw=raw)
        return DataPlane._relayable(answer, model, request)  # type: ignore[arg-type]

    assert relayed("m", "3", "r") is raw
    # another version, model or id than the gateway's own answer would say: encoded again
    assert relayed("m", "1", "r") is None
    assert relayed("other", "3", "r") is None
    assert relayed("m", "3", "") is None


def test_only_the_parameters_an_operator_lists_reach_the_engine() -> None:
    """A device's request parameters (Triton reads ``priority``, ``sequence_id``; a custom
    backend whatever it likes) go on only when the backend's entry names them."""
    import asyncio

    from cloud_gateway.remote.backend import RemoteBackend
    from cloud_gateway.remote.engine import Engine
    from edge_core.protocol.types import InferRequest, InferResponse

    class Recording(Engine):
        def __init__(self) -> None:
            super().__init__(backend("grpc://e:1"), None)
            self.sent: list[InferRequest] = []

        async def ready(self) -> bool:
            return True

        async def index(self) -> list[dict[str, str]]:
            return []

        async def metadata(self, name: str, version: str) -> dict[str, object]:
            return {}

        async def infer(self, request: InferRequest, timeout: float) -> InferResponse:
            self.sent.append(request)
            return InferResponse(request.model_name, "1", {})

    async def sent_with(listed: tuple[str, ...]) -> dict[str, object]:
        engine = Recording()
        remote = RemoteBackend(backend("grpc://e:1", forward_parameters=listed), engine=engine)
        remote.up = True
        request = InferRequest(
            {}, {}, parameters={"priority": 1, "sequence_id": 5, "timeout": 9_000_000}
        )
        await remote.forward(request, "m", "", deadline=None)
        return engine.sent[0].parameters

    assert asyncio.run(sent_with(())) == {}
    # the deadline is the gateway's own, never the device's parameter
    assert asyncio.run(sent_with(("sequence_id", "timeout"))) == {"sequence_id": 5}


def test_an_engine_version_in_unicode_digits_is_no_version() -> None:
    """``"²".isdigit()`` is true and ``int("²")`` fails: an engine's answer is held to
    ASCII digits like anything a client sends."""
    from cloud_gateway.remote.backend import _version

    assert [_version(t) for t in ("3", "²", "٣", "0", "", "12345678901")] == [
        3,
        None,
        None,
        None,
        None,
        None,
    ]
