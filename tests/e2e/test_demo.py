"""`make demo` as a user runs it (the README's first command): it ends well, shows every
decision of the policy and an update over the air, and leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_core.repository import ModelRepository
from tests.support.paths import ROOT


@pytest.mark.slow
def test_the_demo_shows_every_decision_and_an_update(fetched: ModelRepository) -> None:
    # (fetched: `make demo` fetches BlazeFace and the text detector first, as this does)
    result = subprocess.run(
        [sys.executable, "-m", "tools.demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = result.stdout[result.stdout.index("== summary") :]
    for decision in ("LOCAL", "OFFLOAD", "OFFLOAD_REDACTED", "REJECT", "LOCAL_DEGRADED"):
        assert f" {decision} " in summary, decision
    assert "low_confidence" in summary and "breaker_open" in summary
    assert "digits-light v1 before, v2 after" in summary
    assert "everything stopped and the working folder removed" in summary


@pytest.mark.slow
def test_the_demo_keeps_what_it_built_when_asked(fetched: ModelRepository, tmp_path: Path) -> None:
    """`make demo DEMO_FLAGS=--keep`: the folder stays, and its configurations are named,
    for an operator to start from; they load as they are."""
    result = subprocess.run(
        [sys.executable, "-m", "tools.demo", "--keep", "--no-mqtt"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    kept = result.stdout[result.stdout.index("kept /") :]
    work = Path(kept.split()[1].rstrip(":"))
    assert work.parent == tmp_path and work.is_dir()
    for name in ("gateway.toml", "agent.toml", "keys", "ota"):
        assert str(work / name) in kept
    assert "working folder kept" in result.stdout
    from cloud_gateway.config import load_config
    from edge_agent.config import load_agent_config

    assert load_config(work / "gateway.toml").ota_repository == work / "ota"
    assert load_agent_config(work / "agent.toml").device_id
