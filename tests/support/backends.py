"""Backends for a test gateway, at the gateway's own seam (``Backend``)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from cloud_gateway.repository import EmbeddedBackend, LoadedModel
from edge_core.package import ModelPackage
from edge_core.runtime import RuntimeOptions

__all__ = ["SlowBackend"]


class SlowBackend(EmbeddedBackend):
    """The embedded backend, with each run made slower."""

    def __init__(self, delay: float) -> None:
        super().__init__(RuntimeOptions(threads=1, warmup=1))
        self.delay = delay

    def load(self, package: ModelPackage) -> LoadedModel:
        model = super().load(package)
        run = model.run

        def slow(feed: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
            time.sleep(self.delay)
            return run(feed)

        model.run = slow
        return model
