"""The public API is deliberate: exactly what __all__ lists, all of it importable,
and importing a part loads only that part."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import edge_agent
import edge_core.errors

FEATURES = (
    "edge_agent.agent",
    "edge_agent.assemble",
    "edge_agent.offload",
    "edge_agent.ota",
    "edge_agent.policy",
    "edge_agent.privacy",
    "edge_agent.service",
    "edge_agent.telemetry",
    "edge_core.runtime",
    "edge_core.protocol",
)


def loaded_after(statement: str) -> list[str]:
    code = f"import sys; {statement}; print(__import__('json').dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout))


def test_public_api_is_exactly_all() -> None:
    assert sorted(dir(edge_agent)) == sorted(edge_agent.__all__)
    assert set(edge_agent.__all__) - {"__version__"} == set(edge_agent._EXPORTS)
    for name in edge_agent.__all__:
        assert getattr(edge_agent, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = edge_agent.Nothing  # type: ignore[attr-defined]
    result = edge_agent.AgentResult  # the agent's result, from the agent's own module
    assert result.__module__ == "edge_agent.agent.result"


def test_errors_share_one_root() -> None:
    for name in edge_agent.__all__:
        value = getattr(edge_agent, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, edge_core.errors.EdgeError)
    for value in vars(edge_core.errors).values():
        if isinstance(value, type) and issubclass(value, Exception):
            assert value is edge_core.errors.EdgeError or issubclass(
                value, edge_core.errors.EdgeError
            )


def test_importing_the_package_or_its_config_loads_no_feature() -> None:
    for statement in ("import edge_agent", "import edge_agent.config", "import edge_core"):
        loaded = loaded_after(statement)
        assert not [m for m in loaded if m.startswith(FEATURES)], (statement, loaded)
        assert not {"onnxruntime", "ai_edge_litert", "cv2", "grpc", "paho"} & set(loaded)


def test_importing_the_command_line_loads_no_runtime() -> None:
    loaded = set(loaded_after("import edge_agent.cli, cloud_gateway.cli"))
    assert not {"onnxruntime", "ai_edge_litert", "cv2"} & loaded


@pytest.mark.slow
def test_the_gateway_loads_no_device_code() -> None:
    loaded = loaded_after("import cloud_gateway.server, cloud_gateway.cli")
    assert not [m for m in loaded if m == "edge_agent" or m.startswith("edge_agent.")], loaded


def test_the_gateways_public_api_is_exactly_all_and_loaded_when_used() -> None:
    import cloud_gateway

    assert sorted(dir(cloud_gateway)) == sorted(cloud_gateway.__all__)
    assert cloud_gateway.GatewayConfig.__module__ == "cloud_gateway.config"
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = cloud_gateway.Nothing  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "module",
    ["cloud_gateway", "cloud_gateway.batching", "cloud_gateway.config",
     "cloud_gateway.fleet.health", "cloud_gateway.fleet.charts", "cloud_gateway.fleet.telemetry",
     "cloud_gateway.metrics"],
)  # fmt: skip
def test_the_gateways_pure_modules_load_no_server(module: str) -> None:
    """The batching arithmetic, the configuration and the fleet's pure rules import
    without gRPC, FastAPI, uvicorn or SQLAlchemy (the package used to import its
    server eagerly)."""
    loaded = set(loaded_after(f"import {module}"))
    assert not {"grpc", "fastapi", "starlette", "uvicorn", "sqlalchemy", "tritonclient"} & loaded
