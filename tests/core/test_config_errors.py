"""A misspelt name in any strict reader (agent and gateway configurations, profiles,
policies, manifests) is refused with the closest known name and every known one."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud_gateway.config import load_config
from edge_agent.config import load_agent_config
from edge_agent.policy import load_policy
from edge_core.errors import ConfigError


def test_a_misspelt_section_of_the_agents_config_names_the_right_one(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('[gatway]\naddress = "127.0.0.1:8001"\n')
    with pytest.raises(ConfigError) as refused:
        load_agent_config(path)
    message = str(refused.value)
    assert "gatway: unknown field (did you mean 'gateway'?" in message
    for section in ("gateway", "ota", "mqtt", "telemetry", "api"):  # every section is listed
        assert section in message


def test_a_misspelt_field_of_the_gateways_config_names_the_right_one(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('repository = "models"\n[tsl]\ncert = "a"\n')
    with pytest.raises(ConfigError, match=r"tsl: unknown field \(did you mean 'tls'\?"):
        load_config(path)
    path.write_text('repository = "models"\n[mqtt]\nhots = "broker"\n')
    with pytest.raises(ConfigError, match=r"mqtt.hots: unknown field \(did you mean 'host'\?"):
        load_config(path)


def test_a_name_far_from_any_gets_the_list_only(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text("[zzz]\n")
    with pytest.raises(ConfigError) as refused:
        load_policy(path)
    assert "did you mean" not in str(refused.value)
    assert "known fields here: " in str(refused.value)


def test_relative_paths_resolve_against_the_files_folder_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dev-cam-01/agent.toml` once gave `dev-cam-01/dev-cam-01/state` for [ota]: the
    same file must give the same paths however it is named."""
    folder = tmp_path / "dev-cam-01"
    folder.mkdir()
    (folder / "agent.toml").write_text(
        'state_dir = "state"\nmodel_dir = "models"\n[ota]\nbundle = "cam.json"\n'
    )
    monkeypatch.chdir(tmp_path)
    relative = load_agent_config(Path("dev-cam-01/agent.toml"))
    absolute = load_agent_config(folder / "agent.toml")
    assert relative.ota is not None and absolute.ota is not None
    assert relative.state_dir == absolute.state_dir == folder / "state"
    assert relative.ota.state_dir == absolute.ota.state_dir == folder / "state"
    assert relative.ota.bundle == folder / "cam.json" and relative.model_dir == folder / "models"
