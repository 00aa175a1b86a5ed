"""The offload client: breaker and retries with a fake transport (our seam), and the
real gRPC and HTTP transports against a real gateway."""

from __future__ import annotations

import random
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edge_agent.offload import CircuitBreaker, OffloadClient, Transport, make_transport
from edge_agent.offload.http import gateway_timeout_us
from edge_core.errors import (
    BreakerOpen,
    OffloadRejected,
    OffloadTimeout,
    OffloadUnavailable,
)
from edge_core.protocol.types import InferRequest, InferResponse
from edge_core.repository import ModelRepository
from edge_core.tls import TLSSettings
from tests.support.backends import SlowBackend
from tests.support.gateway import GatewayHandle, start_gateway
from tests.support.gateway_calls import direct, metric, small_repository
from tests.support.paths import MODELS
from tests.support.tls import make_cert


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_breaker_opens_probes_and_closes() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=3, cooldown_s=5.0, clock=clock)
    for _ in range(2):
        assert breaker.allow()
        breaker.failure()
    assert breaker.state == "closed"
    breaker.failure()
    assert breaker.state == "open" and breaker.is_open and not breaker.allow()
    clock.now += 5.0
    assert breaker.state == "half_open" and not breaker.is_open
    assert breaker.allow()  # the probe
    assert not breaker.allow()  # only one
    breaker.failure()
    assert breaker.state == "open"
    clock.now += 5.0
    assert breaker.allow()
    breaker.success()
    assert breaker.state == "closed" and breaker.opened == 2


class FakeTransport(Transport):
    """Fails with the queued errors, then answers; records the timeouts it was given."""

    def __init__(self, clock: Clock, errors: list[Exception], cost: float = 0.001) -> None:
        self.clock = clock
        self.errors = list(errors)
        self.cost = cost
        self.timeouts: list[float] = []

    def infer(
        self, request: InferRequest, *, timeout: float, request_id: str = ""
    ) -> InferResponse:
        self.timeouts.append(timeout)
        self.clock.now += self.cost
        if self.errors:
            raise self.errors.pop(0)
        return InferResponse(request.model_name, "1", {"y": np.ones((1, 1), np.float32)})


def make_request() -> InferRequest:
    return InferRequest(
        inputs={"x": np.zeros((1, 4), np.float32)}, datatypes={"x": "FP32"}, model_name="m"
    )


def client(transport: FakeTransport, clock: Clock, **kwargs: object) -> OffloadClient:
    return OffloadClient(transport, clock=clock, sleep=clock.sleep, rng=random.Random(0), **kwargs)  # type: ignore[arg-type]


def test_unavailable_is_retried_with_growing_jittered_pauses() -> None:
    clock = Clock()
    transport = FakeTransport(clock, [OffloadUnavailable("down"), OffloadUnavailable("down")])
    offload = client(transport, clock, retries=2, backoff_s=0.01)
    assert offload.infer(make_request(), deadline=1.0).outputs["y"].shape == (1, 1)
    assert len(transport.timeouts) == 3 and offload.retried == 2
    # each attempt got what was left of the deadline, shrinking by the pauses
    assert transport.timeouts[0] == 1.0 and transport.timeouts[2] < transport.timeouts[1] < 1.0
    assert offload.breaker.state == "closed"


def test_the_link_learns_from_the_answered_attempt_not_the_pauses_before_it() -> None:
    """Retries, their pauses and a dead replica say nothing of the link: only the
    attempt that was answered is timed, with its own bytes and the gateway's time."""
    clock = Clock()

    class Answering(FakeTransport):
        def infer(
            self, request: InferRequest, *, timeout: float, request_id: str = ""
        ) -> InferResponse:
            answer = super().infer(request, timeout=timeout, request_id=request_id)
            answer.parameters["edge_server_us"] = 500  # of its 1 ms
            return replace(answer, wire_bytes=(300, 100))

    transport = Answering(clock, [OffloadUnavailable("down")] * 2, cost=0.001)
    offload = client(transport, clock, retries=2, backoff_s=0.05)
    offload.infer(make_request(), deadline=1.0)
    assert offload.retried == 2 and clock.now > 0.05  # it paused between the tries
    estimate = offload.costs.link.estimate(400)
    assert estimate is not None and estimate.rtt_ms == pytest.approx(0.5)  # 1 ms less 0.5
    assert offload.costs.traffic()["m"] == {"sent": 300, "received": 100, "answered": 1}


def test_a_version_the_cloud_lacks_does_not_mark_the_model_missing() -> None:
    clock = Clock()
    lacks = OffloadRejected("no version 9 of 'm'", status="404")
    transport = FakeTransport(clock, [lacks, OffloadRejected("no model 'm'", status="404")])
    offload = client(transport, clock)
    with pytest.raises(OffloadRejected):
        offload.infer(replace(make_request(), model_version="9"), deadline=1.0)
    assert not offload.catalog.lacks("m")
    with pytest.raises(OffloadRejected):
        offload.infer(make_request(), deadline=1.0)
    assert offload.catalog.lacks("m")


def test_replicas_take_turns_and_a_request_fails_over_within_its_deadline() -> None:
    from edge_agent.offload import FailoverTransport

    clock = Clock()
    a, b = FakeTransport(clock, []), FakeTransport(clock, [])
    replicas = FailoverTransport([a, b], clock=clock)
    for _ in range(4):
        replicas.infer(make_request(), timeout=1.0)
    assert (len(a.timeouts), len(b.timeouts)) == (2, 2)  # round robin
    # a replica that cannot be reached: the same request goes to the next, with what is left
    a.errors = [OffloadUnavailable("connection reset")]
    a.cost = 0.2
    answer = replicas.infer(make_request(), timeout=1.0)
    assert answer.outputs["y"].shape == (1, 1)
    assert replicas.failovers == 1
    assert b.timeouts[-1] == pytest.approx(0.8)
    # every replica down: unavailable (the client's retries and breaker take it from there)
    a.errors = [OffloadUnavailable("down")] * 2
    b.errors = [OffloadUnavailable("down")] * 2
    with pytest.raises(OffloadUnavailable, match="no gateway replica could be reached"):
        replicas.infer(make_request(), timeout=1.0)
    # a refusal or a timeout is the answer: not sent to another replica
    a.errors = b.errors = [OffloadRejected("bad", status="400")]
    before = len(a.timeouts) + len(b.timeouts)
    with pytest.raises(OffloadRejected):
        replicas.infer(make_request(), timeout=1.0)
    assert len(a.timeouts) + len(b.timeouts) == before + 1


def test_the_agent_takes_a_list_of_gateway_replicas(tmp_path: Path) -> None:
    from edge_agent.config import load_agent_config
    from edge_core.errors import ConfigError

    path = tmp_path / "agent.toml"
    path.write_text('[gateway]\naddress = ["gw-a:8001", "gw-b:8001"]\ntoken = "t"\n')
    gateway = load_agent_config(path).gateway
    assert gateway is not None and gateway.replicas == ("gw-a:8001", "gw-b:8001")
    path.write_text('[gateway]\naddress = []\ntoken = "t"\n')
    with pytest.raises(ConfigError, match="a list of them"):
        load_agent_config(path)


def test_retries_are_bounded_and_counted_by_the_breaker() -> None:
    clock = Clock()
    transport = FakeTransport(clock, [OffloadUnavailable("down")] * 10)
    offload = client(transport, clock, retries=2, breaker=CircuitBreaker(failures=2, clock=clock))
    with pytest.raises(OffloadUnavailable):
        offload.infer(make_request(), deadline=1.0)
    assert len(transport.timeouts) == 3
    with pytest.raises(OffloadUnavailable):
        offload.infer(make_request(), deadline=clock.now + 1.0)
    assert offload.breaker.state == "open"
    calls = len(transport.timeouts)
    with pytest.raises(BreakerOpen):
        offload.infer(make_request(), deadline=clock.now + 1.0)
    assert len(transport.timeouts) == calls  # not even tried


def test_timeouts_and_refusals_are_not_retried() -> None:
    clock = Clock()
    transport = FakeTransport(clock, [OffloadTimeout("slow"), OffloadRejected("bad", status="400")])
    offload = client(transport, clock, retries=3)
    with pytest.raises(OffloadTimeout):
        offload.infer(make_request(), deadline=1.0)
    with pytest.raises(OffloadRejected):
        offload.infer(make_request(), deadline=clock.now + 1.0)
    assert len(transport.timeouts) == 2
    assert offload.breaker._failures == 0  # a refusal proves the link works


def test_no_retry_past_the_deadline() -> None:
    clock = Clock()
    transport = FakeTransport(clock, [OffloadUnavailable("down")] * 5, cost=0.04)
    offload = client(transport, clock, retries=5, backoff_s=0.05)
    with pytest.raises(OffloadUnavailable):
        offload.infer(make_request(), deadline=0.1)
    assert clock.now <= 0.1 + 1e-9
    with pytest.raises(OffloadTimeout, match="deadline passed before"):
        offload.infer(make_request(), deadline=clock.now)


# -- real transports against a real gateway -----------------------------------------------


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_transports_match_a_direct_run(gateway: GatewayHandle, protocol: str) -> None:
    address = gateway.grpc_url if protocol == "grpc" else gateway.http_url
    transport = make_transport(protocol, address, token=gateway.device_token)
    x = ModelRepository(MODELS).get("digits-heavy").evaluation()[0][:3].astype(np.float32)
    request = InferRequest(
        inputs={"pixels": x}, datatypes={"pixels": "FP32"}, model_name="digits-heavy", id="r1"
    )
    response = transport.infer(request, timeout=10, request_id="abc123")
    assert np.allclose(response.outputs["probabilities"], direct("digits-heavy", x), atol=1e-6)
    assert response.model_name == "digits-heavy" and response.id == "r1"
    unknown = InferRequest(inputs={"pixels": x}, datatypes={"pixels": "FP32"}, model_name="nope")
    with pytest.raises(OffloadRejected, match="unknown model 'nope'") as info:
        transport.infer(unknown, timeout=10)
    assert info.value.status in ("NOT_FOUND", "404")
    forged = make_transport(protocol, address, token="cam-01.forged")
    with pytest.raises(OffloadRejected, match="invalid token"):
        forged.infer(request, timeout=10)
    transport.close()
    forged.close()


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_transports_translate_unavailable_and_timeout(tmp_path: Path, protocol: str) -> None:

    handle = start_gateway(
        tmp_path, small_repository(tmp_path), backend=SlowBackend(1.0), poll_interval_s=0.0
    )
    try:
        address = handle.grpc_url if protocol == "grpc" else handle.http_url
        transport = make_transport(protocol, address, token=handle.device_token)
        x = np.zeros((1, 64), np.float32)
        request = InferRequest(
            inputs={"pixels": x}, datatypes={"pixels": "FP32"}, model_name="digits-light"
        )
        started = time.monotonic()
        with pytest.raises(OffloadTimeout):
            transport.infer(request, timeout=0.1)
        assert time.monotonic() - started < 0.6  # not the 1 s run
    finally:
        handle.thread.stop()
    with pytest.raises(OffloadUnavailable):
        transport.infer(request, timeout=2)
    transport.close()


def test_grpc_transport_over_tls(tmp_path: Path) -> None:
    from cloud_gateway.config import ServerTLSSettings

    ca = make_cert(tmp_path, "ca", None)
    make_cert(tmp_path, "server", ca, server=True)
    make_cert(tmp_path, "client", ca)
    tls = ServerTLSSettings(
        tmp_path / "server.pem", tmp_path / "server.key", tmp_path / "ca.pem", True
    )
    handle = start_gateway(tmp_path, small_repository(tmp_path), tls=tls, poll_interval_s=0.0)
    try:
        settings = TLSSettings(
            ca=tmp_path / "ca.pem", cert=tmp_path / "client.pem", key=tmp_path / "client.key"
        )
        for protocol, port in (
            ("grpc", handle.gateway.grpc_port),
            ("http", handle.gateway.http_port),
        ):
            transport = make_transport(
                protocol, f"localhost:{port}", token=handle.device_token, tls=settings
            )
            request = InferRequest(
                inputs={"pixels": np.zeros((1, 64), np.float32)},
                datatypes={"pixels": "FP32"},
                model_name="digits-light",
            )
            assert transport.infer(request, timeout=10).outputs["probabilities"].shape == (1, 10)
            transport.close()
    finally:
        handle.thread.stop()


def test_an_unexpected_transport_error_counts_and_never_sticks_the_breaker() -> None:
    clock = Clock()
    transport = FakeTransport(clock, [ValueError("Cannot invoke RPC on closed channel!")] * 5)
    offload = client(
        transport, clock, breaker=CircuitBreaker(failures=1, cooldown_s=1.0, clock=clock)
    )
    with pytest.raises(OffloadUnavailable, match="closed channel"):
        offload.infer(make_request(), deadline=1.0)
    assert offload.breaker.state == "open"
    clock.now += 1.1
    with pytest.raises(OffloadUnavailable):
        offload.infer(make_request(), deadline=clock.now + 1.0)  # the probe fails too
    assert offload.breaker.state == "open"
    clock.now += 1.1
    transport.errors.clear()
    assert offload.infer(make_request(), deadline=clock.now + 1.0).model_name == "m"
    assert offload.breaker.state == "closed"


def test_deadlines_too_short_for_any_gateway_do_not_open_the_breaker() -> None:
    clock = Clock()
    transport = FakeTransport(clock, [OffloadTimeout("slow")] * 10)
    offload = client(transport, clock, breaker=CircuitBreaker(failures=2, clock=clock))
    for _ in range(4):
        with pytest.raises(OffloadTimeout):
            offload.infer(make_request(), deadline=clock.now + 0.005)
    assert offload.breaker.state == "closed"
    for _ in range(2):
        with pytest.raises(OffloadTimeout):
            offload.infer(make_request(), deadline=clock.now + 0.5)
    assert offload.breaker.state == "open"


@pytest.mark.slow
def test_http_sends_the_deadline_and_the_gateway_gives_up_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deadline travels as the ``timeout`` parameter: the gateway fails the request
    itself (its own metric says so) instead of running a model nobody waits for."""
    import edge_agent.offload.http as http_transport

    handle = start_gateway(
        tmp_path, small_repository(tmp_path), backend=SlowBackend(1.5), poll_interval_s=0.0
    )
    try:
        transport = make_transport("http", handle.http_url, token=handle.device_token)
        request = InferRequest(
            inputs={"pixels": np.zeros((1, 64), np.float32)},
            datatypes={"pixels": "FP32"},
            model_name="digits-light",
        )
        labels = {"model": "digits-light", "protocol": "http", "status": "deadline_exceeded"}
        before = metric(handle, "gateway_request_failures_total", **labels)
        # a wide margin (the gateway is told 0.6 s of a 1.2 s timeout) so that its answer
        # is back before the client's own timeout even on a busy machine
        monkeypatch.setattr(http_transport, "ANSWER_MARGIN", 0.5)
        monkeypatch.setattr(http_transport, "MAX_ANSWER_MARGIN_S", 0.6)
        started = time.monotonic()
        with pytest.raises(OffloadTimeout, match="the gateway gave up"):
            transport.infer(request, timeout=1.2)
        assert time.monotonic() - started < 1.2
        assert metric(handle, "gateway_request_failures_total", **labels) == before + 1
        assert request.parameters == {}  # the caller's request is left as it was
        monkeypatch.undo()
        # a shorter timeout of the request's own wins; the time left caps a longer one
        assert gateway_timeout_us(replace(request, parameters={"timeout": 1000}), 1.0) == 1000
        assert gateway_timeout_us(replace(request, parameters={"timeout": 0}), 1.0) == 980_000
        assert gateway_timeout_us(request, 0.1) == 90_000
        transport.close()
    finally:
        handle.thread.stop()
