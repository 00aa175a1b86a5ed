"""The local gRPC API's refusals: the status and message, and the policy's decision in the
trailing metadata (as the HTTP API puts it in the error body), read by a raw grpc call."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from edge_agent.agent import Agent
from edge_agent.config import ApiSettings
from edge_agent.policy.rules import parse_policy
from edge_agent.profiles import ProfileStore
from edge_agent.service.frontend import LocalService
from edge_agent.service.grpc_api import GrpcApi
from edge_agent.service.metrics import ServiceMetrics
from edge_core.protocol.grpc import pb, request_to_proto
from edge_core.protocol.types import InferRequest
from edge_core.repository import ModelRepository
from tests.support.paths import MODELS, PROFILES

# digits-light may only run in the cloud, and this agent has no gateway: refused
POLICY = {"version": 1, "models": {"digits-light": {"placement": "cloud"}}}


@pytest.fixture
def infer() -> Iterator[Any]:
    agent = Agent(
        profile=ProfileStore(PROFILES).get("raspberry-pi-5"),
        repository=ModelRepository(MODELS),
        rules=parse_policy(POLICY),
    )
    api = GrpcApi(LocalService(lambda: agent, ServiceMetrics()), ApiSettings(grpc_port=0))
    api.start()
    channel = grpc.insecure_channel(api.address)
    try:
        yield channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=pb().ModelInferResponse.FromString,
        )
    finally:
        channel.close()
        api.stop(grace=0)
        agent.close()


def call(infer: Any, model: str) -> grpc.RpcError:
    x = np.zeros((1, 64), np.float32)
    request = request_to_proto(
        InferRequest(inputs={"pixels": x}, datatypes={"pixels": "FP32"}, model_name=model)
    )
    with pytest.raises(grpc.RpcError) as info:
        infer(request, timeout=10)
    return info.value


def test_a_refusal_carries_the_decision_in_the_trailing_metadata(infer: Any) -> None:
    error: Any = call(infer, "digits-light")
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    trailing = dict(error.trailing_metadata())
    assert trailing["edge-decision"] == "REJECT"
    assert trailing["edge-model"] == "digits-light"
    assert trailing["edge-reason"] == "no_gateway"  # as in the HTTP error body's decision
    assert "runs in the cloud only" in error.details()  # the message stays


def test_an_error_without_a_decision_has_no_decision_metadata(infer: Any) -> None:
    error: Any = call(infer, "no-such-model")
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert not {"edge-decision", "edge-reason"} & set(dict(error.trailing_metadata()))
