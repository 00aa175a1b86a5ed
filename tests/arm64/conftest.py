"""The emulated aarch64 device (tools/arm64.py), for the tests of this folder only:
``make test-arm64`` prepares it and names its ``emulator.json`` in ``ARM64_EMULATOR``.
Without it (``make test``) these tests are skipped; with it, a missing file fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.emulator import Emulator


@pytest.fixture(scope="session")
def emulator() -> Emulator:
    named = os.environ.get("ARM64_EMULATOR")
    if not named:
        pytest.skip("run by `make test-arm64`, on an emulated aarch64 device")
    path = Path(named)
    assert path.is_file(), f"ARM64_EMULATOR={named}: no such file (tools/arm64.py writes it)"
    return Emulator.load(path)
