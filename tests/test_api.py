"""The public API is deliberate: exactly what __all__ lists, all of it importable."""

from __future__ import annotations

import subprocess
import sys

import edge_agent


def test_public_api_is_exactly_all() -> None:
    public = {name for name in dir(edge_agent) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(edge_agent, name)).__name__ == "module"}
    assert public - modules == set(edge_agent.__all__) - {"__version__"}


def test_errors_share_one_root() -> None:
    for name in edge_agent.__all__:
        value = getattr(edge_agent, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, edge_agent.EdgeError)


def test_importing_the_package_loads_no_runtime() -> None:
    code = (
        "import sys, edge_agent, edge_agent.cli;"
        "print(sorted(m for m in ('onnxruntime', 'ai_edge_litert', 'cv2') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
