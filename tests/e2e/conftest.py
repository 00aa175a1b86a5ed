"""What the end-to-end tests of OTA share: a world (a gateway, its repository and
keys) per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ota_world import OtaWorld, make_world


@pytest.fixture
def world(tmp_path: Path) -> Iterator[OtaWorld]:
    w = make_world(tmp_path)
    yield w
    w.stop()
