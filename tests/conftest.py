"""Shared fixtures: the model repository, the fetched third-party models, device profiles,
a gateway for a module."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edge_agent.privacy.faces import FaceFinder, open_detectors
from edge_agent.profiles import ProfileStore
from edge_core.repository import ModelRepository

from .support import services
from .support.gateway import start_gateway
from .support.paths import MODELS, PROFILES, ROOT

# fixtures that several test modules use, defined beside what they run
pytest_plugins = ["tests.support.postgres", "tests.support.engines", "tests.support.ota_world"]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """Say which test runs, for :func:`tests.support.services.need`."""
    services.running(item)
    try:
        return (yield)
    finally:
        services.running(None)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[object]) -> object:
    """Say which fixture is set up, for :func:`tests.support.services.need`."""
    services.setting_up(fixturedef)
    try:
        return (yield)
    finally:
        services.setting_up(None)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test whose fixtures needed a service, set up for an earlier test, needs it."""
    services.check_fixtures(item)


# fixtures that start a service: a test that uses one needs it
FIXTURE_NEEDS = {"postgres": "postgres", "mlserver": "registry"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark what the fixtures say: a test using a fixture of :data:`FIXTURE_NEEDS`, or
    the ``postgresql`` case of ``state_url``, needs that service."""
    for item in items:
        needs = {FIXTURE_NEEDS[name] for name in item.fixturenames if name in FIXTURE_NEEDS}
        params = getattr(item, "callspec", None)
        if params is not None and params.params.get("state_url") == "postgresql":
            needs.add("postgres")
        for service in sorted(needs):
            item.add_marker(getattr(pytest.mark, service))


@pytest.fixture(scope="session")
def repository() -> ModelRepository:
    return ModelRepository(MODELS)


@pytest.fixture(scope="session")
def profiles() -> ProfileStore:
    return ProfileStore(PROFILES)


@pytest.fixture(scope="session")
def fetched(repository: ModelRepository) -> ModelRepository:
    """The repository with the third-party models fetched into it (once, then cached)."""
    wanted = (
        "face-detection-short-range",
        "face-detection-full-range",
        "face-detection-centerface",
        "ppocr-det",
    )
    if any(not repository.versions(name) for name in wanted):
        subprocess.run([sys.executable, str(ROOT / "tools/fetch_models.py")], check=True)
    return repository


@pytest.fixture(scope="session")
def face_detectors(fetched: ModelRepository) -> tuple[FaceFinder, FaceFinder]:
    """The agent's face detector and its stronger checker (CenterFace, one session)."""
    return open_detectors(fetched)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, fetched: ModelRepository):  # type: ignore[no-untyped-def]
    """A gateway serving the sample and fetched models (read-only: do not change it)."""
    handle = start_gateway(tmp_path_factory.mktemp("gateway"), MODELS, poll_interval_s=0.0)
    yield handle
    handle.thread.stop()
