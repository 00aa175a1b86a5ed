"""What the cloud can answer, as the device learns it: the index, refusals as not
found, models' metadata and the gateway's extensions (a fake transport, our seam)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from edge_agent.offload.base import Transport
from edge_agent.offload.catalog import (
    ENTRIES,
    INDEX_TTL_S,
    METADATA_TTL_S,
    CloudCatalog,
)
from edge_core.errors import ModelNotFoundError, OffloadUnavailable
from edge_core.protocol.types import InferRequest


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Gateway(Transport):
    """A gateway as the catalog asks it: what it serves, what its models take."""

    def __init__(self, models: dict[str, list[dict[str, Any]]]) -> None:
        self.models = models
        self.down = False
        self.asked: list[str] = []
        self.listing = threading.Event()  # an index waits for it
        self.listing.set()

    def infer(self, request: InferRequest, *, timeout: float, request_id: str = "") -> Any:
        raise AssertionError("the catalog sends no request")

    def _ask(self, what: str) -> None:
        self.asked.append(what)
        if self.down:
            raise OffloadUnavailable("down")

    def model_metadata(self, name: str, *, timeout: float) -> dict[str, Any] | None:
        self._ask(f"metadata {name}")
        if name not in self.models:
            raise ModelNotFoundError(f"unknown model {name!r}")
        return {"name": name, "inputs": self.models[name]}

    def server_metadata(self, *, timeout: float) -> dict[str, Any] | None:
        self._ask("server")
        return {"extensions": ["binary_tensor_data", "edge_pictures"]}

    def repository_index(self, *, timeout: float) -> list[dict[str, Any]] | None:
        self._ask("index")
        self.listing.wait(5.0)
        return [{"name": name, "version": "1", "state": "READY"} for name in self.models]


PIXELS = [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]


def test_the_index_says_what_the_cloud_lacks_and_is_refreshed_in_the_background() -> None:
    clock = Clock()
    gateway = Gateway({"digits-heavy": PIXELS})
    catalog = CloudCatalog(gateway, clock=clock)
    assert catalog.index() is None
    gateway.listing.clear()
    assert not catalog.lacks("digits-xl")  # nothing known yet: taken as present; asks
    assert not catalog.lacks("digits-xl")  # one question at a time
    gateway.listing.set()
    waited = wait_for_index(catalog)
    assert waited == frozenset({"digits-heavy"})
    assert catalog.lacks("digits-xl") and not catalog.lacks("digits-heavy")
    assert gateway.asked == ["server", "index"]  # the extensions come with the index
    gateway.models["digits-xl"] = PIXELS  # published later: known at the next refresh
    clock.now += INDEX_TTL_S + 1
    gateway.listing.clear()
    assert catalog.lacks("digits-xl")  # the old index answers while the new one comes
    gateway.listing.set()
    wait_for(lambda: not catalog.lacks("digits-xl"))
    assert gateway.asked == ["server", "index", "server", "index"]


def test_a_refusal_as_not_found_marks_a_model_missing_until_an_index_lists_it() -> None:
    clock = Clock()
    gateway = Gateway({})
    gateway.down = True  # no index: only what offloads say
    catalog = CloudCatalog(gateway, clock=clock)
    catalog.missing("digits-heavy")
    assert catalog.lacks("digits-heavy")
    gateway.down = False
    gateway.models["digits-heavy"] = PIXELS
    clock.now += INDEX_TTL_S + 1
    catalog.refresh()
    assert not catalog.lacks("digits-heavy")


def test_metadata_is_asked_once_and_kept_and_a_missing_model_is_said() -> None:
    clock = Clock()
    gateway = Gateway({"digits-heavy": PIXELS})
    catalog = CloudCatalog(gateway, clock=clock, on_exchange=lambda seconds: None)
    catalog._index_at = clock.now  # no background index in this test
    found = catalog.metadata("digits-heavy", timeout=1.0)
    assert found is not None and [s.name for s in found.inputs] == ["pixels"]
    assert found.inputs[0].shape == (-1, 64)
    assert catalog.metadata("digits-heavy", timeout=1.0) is found
    assert gateway.asked == ["metadata digits-heavy"]
    with pytest.raises(ModelNotFoundError, match="the cloud does not have digits-xl"):
        catalog.metadata("digits-xl", timeout=1.0)
    assert catalog.lacks("digits-xl")
    with pytest.raises(ModelNotFoundError):  # known: not asked again
        catalog.metadata("digits-xl", timeout=1.0)
    assert gateway.asked == ["metadata digits-heavy", "metadata digits-xl"]
    clock.now += METADATA_TTL_S + 1
    assert catalog.metadata("digits-heavy", timeout=1.0) is not found
    gateway.down = True
    clock.now += METADATA_TTL_S + 1
    assert catalog.metadata("digits-heavy", timeout=1.0) is None  # cannot be known now


def test_extensions_are_asked_once_and_unknown_means_none() -> None:
    clock = Clock()
    exchanges: list[float] = []
    gateway = Gateway({})
    catalog = CloudCatalog(gateway, clock=clock, on_exchange=exchanges.append)
    gateway.down = True
    assert catalog.extensions(timeout=1.0) == frozenset()  # nothing assumed
    gateway.down = False
    assert catalog.extensions(timeout=1.0) == frozenset()  # not asked again at once
    clock.now += 6
    assert "edge_pictures" in catalog.extensions(timeout=1.0)
    assert catalog.extensions(timeout=1.0) == catalog.known_extensions()
    assert gateway.asked == ["server", "server"]
    assert len(exchanges) == 1  # an answered question teaches the link its round trip


def test_the_index_kept_is_bounded() -> None:
    gateway = Gateway({f"m{i}": PIXELS for i in range(ENTRIES + 1)})
    catalog = CloudCatalog(gateway, clock=Clock())
    catalog.refresh()
    assert catalog.index() is None and not catalog.lacks("anything")  # too many: not kept
    for index in range(ENTRIES + 5):
        catalog.missing(f"x{index}")
    assert len(catalog._missing) == ENTRIES


def wait_for_index(catalog: CloudCatalog) -> frozenset[str]:
    wait_for(lambda: catalog.index() is not None)
    index = catalog.index()
    assert index is not None
    return index


def wait_for(condition: Any, timeout: float = 5.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("not within 5 s")


def test_mqtt_learns_the_extensions_from_its_answers() -> None:
    from edge_agent.offload.client import OffloadClient
    from edge_agent.offload.mqtt import MqttTransport

    class Connection:
        device_id = "cam-01"
        connected = True

        def subscribe(self, topic: str, handler: Any) -> None:
            self.handler = handler

    transport = MqttTransport(Connection())  # type: ignore[arg-type]
    assert not transport.asks_the_gateway
    assert transport.server_metadata(timeout=1.0) is None  # nothing can be asked
    assert transport.learnt_extensions() is None  # nor was anything answered yet
    transport.extensions = ["edge_pictures", "edge_compression"]  # as an answer named them
    assert transport.learnt_extensions() == frozenset(transport.extensions)
    client = OffloadClient(transport)
    assert not client.catalog.lacks("anything")  # no index, and no listing started
    assert client.catalog.questions == 0 and client.costs.link.samples == 0
