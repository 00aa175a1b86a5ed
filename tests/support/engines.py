"""Third-party and second-gateway engines behind a test gateway (the remote backend).

MLServer 1.7.1 comes from PyPI into its own cached environment
(:mod:`benchmarks.peers.mlserver`), never into the project's; the first test run
installs it (about a minute), later ones reuse it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.peers import mlserver as mlserver_engine
from edge_core.processes import free_port, stop_process

from .paths import MODELS
from .services import need

__all__ = ["MLServer", "mlserver"]


@dataclass
class MLServer:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log: Path

    def url(self, protocol: str) -> str:
        port = self.grpc_port if protocol == "grpc" else self.http_port
        return f"{protocol}://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLServer]:
    """MLServer serving digits-heavy (ONNX FP32 through our custom runtime)."""
    need("registry")  # MLServer is installed into a venv of its own
    folder = tmp_path_factory.mktemp("mlserver")
    mlserver_engine.model_dir(folder / "models", MODELS / "digits-heavy" / "1")
    http_port, grpc_port = free_port(), free_port()
    log = folder / "mlserver.log"
    process = mlserver_engine.start(folder / "models", http_port, grpc_port, log=log)
    yield MLServer(process, http_port, grpc_port, log)
    stop_process(process)
