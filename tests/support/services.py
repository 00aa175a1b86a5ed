"""What a test needs beyond Python, declared by its marker and checked where it starts.

Each helper that starts an outside program or reaches the package registry calls
:func:`need` first; a test that has not declared that service with its marker
(``@pytest.mark.broker``, or ``pytestmark`` for its module) fails there, naming the
marker. So ``make test-fast`` (``-m`` without any of them) really needs none of them,
and the markers stay true as tests change."""

from __future__ import annotations

import pytest

__all__ = ["SERVICES", "need", "running"]

SERVICES = {
    "broker": "a real Mosquitto",
    "postgres": "a real PostgreSQL",
    "browser": "headless Chromium",
    "haproxy": "HAProxy",
    "registry": "packages from the package registry",
}

_current: list[pytest.Item] = []


def need(service: str) -> None:
    """Fail the running test unless it is marked as needing ``service``."""
    assert service in SERVICES, service
    if _current and _current[-1].get_closest_marker(service) is None:
        pytest.fail(
            f"{_current[-1].nodeid} needs {SERVICES[service]}: mark it "
            f"@pytest.mark.{service} (or its module: pytestmark)",
            pytrace=False,
        )


def running(item: pytest.Item | None) -> None:
    """The test now being set up, run or torn down (``None`` between tests)."""
    _current.clear()
    if item is not None:
        _current.append(item)
