"""Inference on its own cores (`inference_cpus`)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from cloud_gateway import cpus
from cloud_gateway.config import load_config
from cloud_gateway.repository import Backend, EmbeddedBackend
from edge_core.errors import ConfigError
from edge_core.package import ModelPackage
from edge_core.runtime import RuntimeOptions
from tests.support.gateway import start_gateway
from tests.support.paths import MODELS

CORES = sorted(cpus.available())
needs_two_cores = pytest.mark.skipif(len(CORES) < 2, reason="needs two CPU cores")


def test_check_names_what_is_wrong() -> None:
    with pytest.raises(ConfigError, match=r"expected a non-empty list .* not \[4096\]"):
        cpus.check([4096])
    with pytest.raises(ConfigError, match="non-empty"):
        cpus.check([])
    with pytest.raises(ConfigError, match="takes every core: leave at least one"):
        cpus.check(CORES)


@needs_two_cores
def test_config_gives_one_runtime_thread_per_inference_core(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(f'repository = "models"\ninference_cpus = [{CORES[-1]}]\n')
    config = load_config(path)
    assert config.inference_cpus == (CORES[-1],)
    assert config.runtime.threads == 1
    path.write_text('repository = "models"\ninference_cpus = [4096]\n')
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert "inference_cpus" in str(refused.value) and "4096" in str(refused.value)


class RecordingBackend:
    """The embedded backend, noting the cores of the thread that ran each request."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.seen: list[tuple[str, frozenset[int]]] = []

    def load(self, package: ModelPackage) -> Any:
        model = self.inner.load(package)
        run = model.run

        def recording(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            self.seen.append((threading.current_thread().name, cpus.available()))
            return run(feed)

        model.run = recording
        return model


@needs_two_cores
def test_inference_runs_on_its_cores_and_the_front_ends_on_the_others(tmp_path: Path) -> None:
    inference = (CORES[-1],)
    backend = RecordingBackend(EmbeddedBackend(RuntimeOptions(threads=1, warmup=1)))
    handle = start_gateway(tmp_path, MODELS, backend=backend, inference_cpus=inference)
    try:

        async def loop_cores() -> frozenset[int]:
            return cpus.available()

        assert handle.thread.call(loop_cores()) == frozenset(CORES[:-1])
        body = {
            "inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]
        }
        for model in ("digits-heavy", "digits-light"):  # batched, and run directly
            answer = httpx.post(
                f"http://{handle.http_url}/v2/models/{model}/infer",
                json=body,
                headers=handle.headers(),
            )
            assert answer.status_code == 200, answer.text
    finally:
        handle.thread.stop()
    assert len(backend.seen) == 2
    assert all(
        name.startswith("inference") and cores == frozenset(inference)
        for name, cores in backend.seen
    )
