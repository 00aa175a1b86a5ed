"""What a test needs beyond Python, declared by its marker and checked where it starts.

Each helper that starts an outside program or reaches the package registry calls
:func:`need` first; a test that has not declared that service with its marker
(``@pytest.mark.broker``, or ``pytestmark`` for its module) fails there, naming the
marker. So ``make test-fast`` (``-m`` without any of them) really needs none of them,
and the markers stay true as tests change. A module- or session-scoped fixture that
needs one is remembered (:func:`setting_up`): every later test that uses it, its
value cached, is checked too (:func:`check_fixtures`)."""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["SERVICES", "check_fixtures", "need", "running", "setting_up"]

SERVICES = {
    "broker": "a real Mosquitto",
    "postgres": "a real PostgreSQL",
    "browser": "headless Chromium",
    "haproxy": "HAProxy",
    "registry": "packages from the package registry",
}

_current: list[pytest.Item] = []
_fixtures: list[Any] = []  # the fixtures (pytest's FixtureDef) being set up
_needs: dict[int, set[str]] = {}  # a cached fixture's id -> the services it needed


def need(service: str) -> None:
    """Fail the running test unless it is marked as needing ``service``; a cached
    fixture being set up is remembered as needing it."""
    assert service in SERVICES, service
    if _fixtures and _fixtures[-1].scope != "function":  # set up again for each test
        _needs.setdefault(id(_fixtures[-1]), set()).add(service)
    if _current:
        _check(_current[-1], service)


def check_fixtures(item: pytest.Item) -> None:
    """Fail ``item`` if a fixture it uses needed a service it is not marked for (the
    fixture itself, not another of its name in another module)."""
    info = getattr(item, "_fixtureinfo", None)
    for definitions in getattr(info, "name2fixturedefs", {}).values():
        for service in sorted(_needs.get(id(definitions[-1]), ())) if definitions else ():
            _check(item, service)


def setting_up(fixture: Any) -> None:
    """``fixture`` (pytest's FixtureDef) starts being set up (``None``: the innermost
    one is done)."""
    if fixture is None:
        _fixtures.pop()
    else:
        _fixtures.append(fixture)


def _check(item: pytest.Item, service: str) -> None:
    if item.get_closest_marker(service) is None:
        pytest.fail(
            f"{item.nodeid} needs {SERVICES[service]}: mark it "
            f"@pytest.mark.{service} (or its module: pytestmark)",
            pytrace=False,
        )


def running(item: pytest.Item | None) -> None:
    """The test now being set up, run or torn down (``None`` between tests)."""
    _current.clear()
    if item is not None:
        _current.append(item)
