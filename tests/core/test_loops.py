"""The event loop the gateway runs on: uvloop where installed, asyncio's on request."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import urllib.request
from pathlib import Path

import pytest
import uvloop

from cloud_gateway.cli import main
from edge_core import loops
from tests.support.paths import MODELS


def without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        loops.importlib.util, "find_spec", lambda name: None if name == "uvloop" else real(name)
    )


def test_auto_is_uvloop_where_installed_and_asyncio_without(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert loops.loop_name() == "uvloop"
    assert isinstance(loops.new_event_loop(), uvloop.Loop)
    plain = loops.new_event_loop("asyncio")
    assert not isinstance(plain, uvloop.Loop)
    assert loops.loop_kind(plain) == "asyncio"
    plain.close()
    without_uvloop(monkeypatch)
    assert loops.loop_name("auto") == "asyncio"
    with pytest.raises(ValueError, match="uvloop is not installed"):
        loops.loop_name("uvloop")


def test_an_unknown_loop_is_refused() -> None:
    with pytest.raises(ValueError, match="choose from auto, uvloop, asyncio"):
        loops.loop_name("trio")
    with pytest.raises(SystemExit) as info:
        main(["serve", "--loop", "trio"])
    assert info.value.code == 2


def test_serve_says_so_when_uvloop_is_asked_for_and_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    without_uvloop(monkeypatch)
    assert main(["serve", "--loop", "uvloop"]) == 2
    assert "uvloop is not installed" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
def test_run_runs_on_the_loop_asked_for(kind: str) -> None:
    async def which() -> str:
        return loops.loop_kind(asyncio.get_running_loop())

    assert loops.run(which(), kind) == kind


@pytest.mark.parametrize("kind", ["auto", "asyncio"])
def test_a_gateway_serves_on_either_loop(tmp_path: Path, kind: str) -> None:
    from cloud_gateway import GatewayConfig, GatewayThread
    from cloud_gateway.auth import DeviceRegistry

    config = GatewayConfig(
        repository=MODELS, state_dir=tmp_path / "state", http_port=0, grpc_port=0
    )
    token = DeviceRegistry.add_to(config.state_url, "cam-01", "rpi5-int8")
    thread = GatewayThread(config, loop=kind)
    try:

        async def which() -> str:
            return loops.loop_kind(asyncio.get_running_loop())

        assert thread.call(which()) == ("uvloop" if kind == "auto" else "asyncio")
        body = json.dumps(
            {
                "inputs": [
                    {"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}
                ]
            }
        ).encode()
        request = urllib.request.Request(
            f"http://{thread.http_url}/v2/models/digits-light/infer",
            data=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            outputs = json.loads(answer.read())["outputs"]
        assert outputs[0]["shape"][0] == 1
    finally:
        thread.stop()
