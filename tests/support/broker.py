"""A real Mosquitto for the tests, with the controls the fault tests need: stop and
start it (from its base) and reload its password and ACL files."""

from __future__ import annotations

import time
from typing import Any

from benchmarks.agent.mosquitto import Mosquitto
from edge_core.errors import EdgeError

from .services import need

__all__ = ["TestBroker"]


class TestBroker(Mosquitto):
    __test__ = False  # not a test class, for pytest

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        need("broker")
        super().__init__(*args, **kwargs)

    def reload(self, timeout: float = 10.0) -> None:
        """SIGHUP: re-read the password and ACL files. Returns once the broker has
        begun the reload, which it finishes before it reads another packet."""
        assert self.process is not None
        before = self._reloads()
        self.process.send_signal(1)
        end = time.monotonic() + timeout
        while self._reloads() == before:
            if time.monotonic() > end:
                raise EdgeError(f"mosquitto did not reload within {timeout} s")
            time.sleep(0.01)

    def _reloads(self) -> int:
        try:
            return self.log.read_text(errors="replace").count("Reloading config")
        except FileNotFoundError:
            return 0
