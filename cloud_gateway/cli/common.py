"""What the ``cloud-gateway`` commands share: the configuration the global flags name."""

from __future__ import annotations

import argparse
from pathlib import Path

from cloud_gateway.auth import DeviceRegistry
from cloud_gateway.config import GatewayConfig, Overrides, load_config

__all__ = ["config_of", "device_registry", "ota_dir_of", "state_dir_of"]


def config_of(args: argparse.Namespace) -> GatewayConfig:
    return load_config(
        args.config,
        Overrides(
            repository=getattr(args, "repository", None),
            state_dir=args.state_dir,
            host=getattr(args, "host", None),
            http_port=getattr(args, "http_port", None),
            grpc_port=getattr(args, "grpc_port", None),
        ),
    )


def device_registry(args: argparse.Namespace) -> DeviceRegistry:
    if args.config is not None:
        return DeviceRegistry(
            load_config(args.config, Overrides(repository=Path("."))).devices_file
        )
    return DeviceRegistry(
        (args.state_dir or GatewayConfig(repository=Path(".")).state_dir) / "devices.json"
    )


def state_dir_of(args: argparse.Namespace) -> Path:
    if args.config is not None:
        return load_config(args.config, Overrides(repository=Path("."))).state_dir
    return Path(args.state_dir or GatewayConfig(repository=Path(".")).state_dir)


def ota_dir_of(args: argparse.Namespace) -> Path | None:
    if getattr(args, "repository", None) is not None:
        return Path(args.repository)
    if args.config is not None:
        return load_config(args.config, Overrides(repository=Path("."))).ota_repository
    return None
