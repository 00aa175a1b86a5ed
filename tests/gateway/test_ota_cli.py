"""The OTA workflow from the command line, as an operator and a device would run it."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cloud_gateway import GatewayConfig, GatewayThread
from tests.support.paths import MODELS, ROOT


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=120
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.slow
def test_operator_and_device_commands(tmp_path: Path) -> None:
    keys, ota, state = tmp_path / "keys", tmp_path / "ota", tmp_path / "state"
    gateway = ["cloud_gateway", "--state-dir", str(state)]
    run(*gateway, "keys", "init", "--dir", str(keys))
    assert all(
        mode(keys / f"{role}.key") == 0o600 for role in ("root", "targets", "snapshot", "timestamp")
    )
    refused = run(*gateway, "keys", "init", "--dir", str(keys), check=False)
    assert refused.returncode == 1 and "refusing to overwrite" in refused.stderr

    # the README's order: an empty signed repository first, then a device joins (before
    # anything is published) and gets its root as trust anchor, then the first publish
    run(*gateway, "ota", "init", "--repository", str(ota), "--keys", str(keys))
    again = run(*gateway, "ota", "init", "--repository", str(ota), "--keys", str(keys), check=False)
    assert again.returncode == 1 and "exists already" in again.stderr
    bundle = tmp_path / "cam-01.json"
    added = run(
        *gateway, "device", "add", "cam-01", "--group", "rpi5-int8", "--repository", str(ota),
        "--bundle", str(bundle),
    )  # fmt: skip
    assert mode(bundle) == 0o600
    document = json.loads(bundle.read_text())
    assert document["token"] == added.stdout.strip()
    assert document["trusted_root"]["signed"]["_type"] == "root"
    assert mode(state / "groups" / "rpi5-int8.json") == 0o600
    published = run(
        *gateway, "models", "publish", "--repository", str(ota), "--keys", str(keys),
        "--name", "digits-light", "--version", "2", "--file", str(MODELS / "digits-light/1/model.int8.tflite"),
        "--group", "rpi5-int8",
    )  # fmt: skip
    assert "published digits-light v2" in published.stdout
    assert "initialised" not in published.stderr  # ota init made it
    refreshed = run(*gateway, "ota", "refresh", "--repository", str(ota), "--keys", str(keys))
    assert "signed new timestamp metadata" in refreshed.stdout
    assert "snapshot  expires" in refreshed.stdout and refreshed.stderr == ""
    no_group = run(
        *gateway, "models", "publish", "--repository", str(ota), "--keys", str(keys), "--name", "x",
        "--version", "1", "--file", str(MODELS / "digits-light/1/model.fp32.onnx"), "--group", "nobody",
        check=False,
    )  # fmt: skip
    assert no_group.returncode == 1 and "group 'nobody' has no key in" in no_group.stderr

    run(
        *gateway,
        "rollout",
        "start",
        "--name",
        "digits-light",
        "--version",
        "2",
        "--group",
        "rpi5-int8",
        "--percent",
        "100",
    )
    config = GatewayConfig(
        repository=MODELS,
        state_dir=state,
        http_port=0,
        grpc_port=0,
        poll_interval_s=0.0,
        ota_repository=ota,
    )
    thread = GatewayThread(config)
    try:
        agent_config = tmp_path / "agent.toml"
        agent_config.write_text(
            'profile = "raspberry-pi-5"\n'
            f'[ota]\nbundle = "{bundle}"\nurl = "http://{thread.http_url}"\nstate_dir = "{tmp_path / "device"}"\n'
        )
        updated = run("edge_agent", "update", "--config", str(agent_config))
        outcomes = json.loads(updated.stdout)["outcomes"]
        assert [(o["name"], o["version"], o["status"]) for o in outcomes] == [
            ("digits-light", 2, "installed")
        ]
        # the progress bar, in the units of a small model (it once read 0.0/0.0 MB)
        assert re.search(r"digits-light: \[#+\] [0-9.]+ kB/[0-9.]+ kB", updated.stderr)
        status = run(*gateway, "rollout", "status").stdout
        assert "digits-light" in status and "installed 1" in status
        by_device = run(*gateway, "rollout", "status", "--devices").stdout
        assert re.search(r"cam-01 +installed +smoke test passed: tflite-int8", by_device)
        devices = run(*gateway, "device", "list").stdout
        row = next(line for line in devices.splitlines() if line.startswith("cam-01"))
        assert "digits-light v2" in row and re.search(r"\d+ s ago \(update (check|report)\)", row)

        run(
            *gateway, "models", "publish", "--repository", str(ota), "--keys", str(keys), "--name",
            "digits-light", "--version", "3", "--file", str(MODELS / "digits-light/1/model.fp32.tflite"),
            "--group", "rpi5-int8",
        )  # fmt: skip
        run(
            *gateway,
            "rollout",
            "start",
            "--name",
            "digits-light",
            "--version",
            "3",
            "--group",
            "rpi5-int8",
            "--percent",
            "100",
        )
        paused = run(
            *gateway, "rollout", "pause", "--name", "digits-light", "--version", "3"
        ).stdout
        assert "paused" in paused
        assert (
            json.loads(run("edge_agent", "update", "--config", str(agent_config)).stdout)[
                "outcomes"
            ][0]["status"]
            == "current"
        )
        run(*gateway, "rollout", "resume", "--name", "digits-light", "--version", "3")
        assert (
            json.loads(run("edge_agent", "update", "--config", str(agent_config)).stdout)[
                "outcomes"
            ][0]["version"]
            == 3
        )
        rolled = run(
            "edge_agent", "models", "rollback", "digits-light", "--config", str(agent_config)
        )
        assert "back to version 2" in rolled.stdout
        infer = run(
            "edge_agent", "infer", "--config", str(agent_config), "--model", "digits-light", "--input",
            str(tmp_path / "x.npy"), check=False,
        )  # fmt: skip
        assert "does not exist" in infer.stderr
        import numpy as np

        np.save(tmp_path / "x.npy", np.zeros((1, 64), np.float32))
        answer = json.loads(run(
            "edge_agent", "infer", "--config", str(agent_config), "--model", "digits-light", "--input",
            str(tmp_path / "x.npy"),
        ).stdout)  # fmt: skip
        assert (
            answer["version"] == 2 and answer["variant"] == "tflite-int8"
        )  # served from the OTA slot
        # v3 is the version left by hand: the gateway does not offer it again
        assert (
            json.loads(run("edge_agent", "update", "--config", str(agent_config)).stdout)[
                "outcomes"
            ][0]["version"]
            == 2
        )
        run(*gateway, "rollout", "start", "--name", "digits-light", "--version", "3",
            "--group", "rpi5-int8", "--percent", "100")  # fmt: skip
        assert (
            json.loads(run("edge_agent", "update", "--config", str(agent_config)).stdout)[
                "outcomes"
            ][0]["version"]
            == 3
        )
        aborted = run(*gateway, "rollout", "abort", "--name", "digits-light")
        assert "aborted" in aborted.stdout
        assert "until it is withdrawn in the signed metadata" in aborted.stderr
        assert "models withdraw" in aborted.stderr and "--version 3" in aborted.stderr
        stays = json.loads(run("edge_agent", "update", "--config", str(agent_config)).stdout)
        assert [(o["version"], o["status"]) for o in stays["outcomes"]] == [(3, "skipped")]
        withdrawn = run(
            *gateway, "models", "withdraw", "--repository", str(ota), "--keys", str(keys),
            "--name", "digits-light", "--version", "3",
        )  # fmt: skip
        assert "withdrew digits-light v3" in withdrawn.stdout
        back = json.loads(run("edge_agent", "update", "--config", str(agent_config)).stdout)
        assert (3, "rolled_back") in [(o["version"], o["status"]) for o in back["outcomes"]]
        answer = json.loads(run(
            "edge_agent", "infer", "--config", str(agent_config), "--model", "digits-light", "--input",
            str(tmp_path / "x.npy"),
        ).stdout)  # fmt: skip
        assert answer["version"] == 2
        status = run(*gateway, "rollout", "status").stdout
        assert "rolled back 1" in status
    finally:
        thread.stop()


def test_the_docs_run_the_commands_in_this_order() -> None:
    page = (ROOT / "docs" / "ota.md").read_text()
    section = page[page.index("## The operator's commands") :]
    block = section[section.index("```sh") : section.index("```", section.index("```sh") + 5)]
    order = [
        block.index(command)
        for command in ("keys init", "ota init", "device add", "models publish", "rollout start")
    ]
    assert order == sorted(order), block
    assert "--repository ota --bundle" in block  # the device add that needs the root


@pytest.mark.slow
def test_keys_init_force_never_replaces_keys_a_repository_uses(tmp_path: Path) -> None:
    keys, ota, state = tmp_path / "keys", tmp_path / "ota", tmp_path / "state"
    gateway = ["cloud_gateway", "--state-dir", str(state)]
    run(*gateway, "keys", "init", "--dir", str(keys))
    before = (keys / "root.key").read_bytes()
    no_repository = run(*gateway, "keys", "init", "--dir", str(keys), "--force", check=False)
    assert no_repository.returncode == 1 and "--repository OTA_DIR" in no_repository.stderr
    run(*gateway, "device", "add", "cam-01", "--group", "rpi5-int8")
    run(
        *gateway, "models", "publish", "--repository", str(ota), "--keys", str(keys),
        "--name", "digits-light", "--version", "2", "--file", str(MODELS / "digits-light/1/model.int8.tflite"),
        "--group", "rpi5-int8",
    )  # fmt: skip
    in_use = run(
        *gateway, "keys", "init", "--dir", str(keys), "--force", "--repository", str(ota),
        check=False,
    )  # fmt: skip
    assert in_use.returncode == 1 and "keys rotate" in in_use.stderr
    assert (keys / "root.key").read_bytes() == before
    # for a repository that has no metadata yet, the old keys are kept aside, not destroyed
    run(
        *gateway,
        "keys",
        "init",
        "--dir",
        str(keys),
        "--force",
        "--repository",
        str(tmp_path / "new"),
    )
    assert (keys / "root.key").read_bytes() != before
    retired = next(keys.glob("retired-*"))
    assert (retired / "root.key").read_bytes() == before
    assert mode(keys / "root.key") == 0o600
