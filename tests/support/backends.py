"""Backends for a test gateway, at the gateway's own seam (``Backend``): the embedded
backend, each model's ``run`` wrapped to be slower or to keep what it received."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from cloud_gateway.repository import EmbeddedBackend, LoadedModel
from edge_core.package import ModelPackage
from edge_core.runtime import RuntimeOptions

__all__ = ["RecordingBackend", "SlowBackend"]

Feed = dict[str, np.ndarray[Any, Any]]


class _Watched(EmbeddedBackend):
    """The embedded backend, with :meth:`before` called ahead of each run."""

    def __init__(self) -> None:
        super().__init__(RuntimeOptions(threads=1, warmup=1))

    def before(self, package: ModelPackage, feed: Feed) -> None:
        raise NotImplementedError

    def load(self, package: ModelPackage) -> LoadedModel:
        model = super().load(package)
        run = model.run

        def watched(feed: Feed) -> Feed:
            self.before(package, feed)
            return run(feed)

        model.run = watched
        return model


class SlowBackend(_Watched):
    """The embedded backend, with each run made slower."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def before(self, package: ModelPackage, feed: Feed) -> None:
        time.sleep(self.delay)


class RecordingBackend(_Watched):
    """The embedded backend, keeping what each model received, by model name."""

    def __init__(self) -> None:
        super().__init__()
        self.received: dict[str, list[Feed]] = {}
        self.lock = threading.Lock()

    def before(self, package: ModelPackage, feed: Feed) -> None:
        with self.lock:
            self.received.setdefault(package.name, []).append(
                {k: v.copy() for k, v in feed.items()}
            )
