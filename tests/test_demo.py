"""`make demo` as a user runs it (the README's first command): it ends well, shows every
decision of the policy and an update over the air, and leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys

from edge_core.repository import ModelRepository

from .support.paths import ROOT


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
