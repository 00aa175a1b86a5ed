"""A real gateway (uvicorn + grpc.aio) in a thread of the test process, with a device
and an admin token."""

from __future__ import annotations

import dataclasses
from pathlib import Path

__all__ = ["GatewayHandle", "registry_in", "start_gateway"]


class GatewayHandle:
    """A real gateway (uvicorn + grpc.aio) on free loopback ports, and tokens for it."""

    def __init__(self, thread, device_token: str, admin_token: str, state_dir: Path) -> None:  # type: ignore[no-untyped-def]
        self.thread = thread
        self.gateway = thread.gateway
        self.device_token = device_token
        self.admin_token = admin_token
        self.state_dir = state_dir

    @property
    def http_url(self) -> str:
        return self.thread.http_url

    @property
    def grpc_url(self) -> str:
        return self.thread.grpc_url

    def headers(self, token: str | None = None) -> dict[str, str]:
        """Fresh headers (tritonclient adds to the dict it is given)."""
        return {"authorization": f"Bearer {token or self.device_token}"}


def start_gateway(tmp: Path, repository: Path, backend=None, **overrides) -> GatewayHandle:  # type: ignore[no-untyped-def]
    from cloud_gateway import GatewayConfig, GatewayThread
    from cloud_gateway.auth import DeviceRegistry

    config = GatewayConfig(repository=repository, state_dir=tmp / "state", http_port=0, grpc_port=0)
    config = dataclasses.replace(config, **overrides)
    device_token = DeviceRegistry.add_to(config.state_url, "cam-01", "rpi5-int8")
    admin_token = DeviceRegistry.add_to(config.state_url, "ops", "operators", role="admin")
    return GatewayHandle(
        GatewayThread(config, backend=backend), device_token, admin_token, config.state_dir
    )


def registry_in(state_dir: Path):  # type: ignore[no-untyped-def]
    """The device registry of the embedded state database of ``state_dir`` (what a
    gateway with no ``state`` setting uses)."""
    from cloud_gateway import GatewayConfig
    from cloud_gateway.auth import DeviceRegistry
    from cloud_gateway.state import open_state

    return DeviceRegistry(open_state(GatewayConfig(Path("."), state_dir=state_dir).state_url))
