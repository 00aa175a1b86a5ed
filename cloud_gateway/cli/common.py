"""What the ``cloud-gateway`` commands share: the configuration the global flags name,
and the state database it points at (``--state URL`` or the file's ``state``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cloud_gateway.auth import DeviceRegistry
from cloud_gateway.config import GatewayConfig, Overrides, load_config
from cloud_gateway.state import StateDatabase, open_state

__all__ = [
    "config_of",
    "device_registry",
    "ota_dir_of",
    "settings_of",
    "state_database",
    "state_dir_of",
]


def config_of(args: argparse.Namespace) -> GatewayConfig:
    return load_config(
        args.config,
        Overrides(
            repository=getattr(args, "repository", None),
            state_dir=args.state_dir,
            state=args.state,
            host=getattr(args, "host", None),
            http_port=getattr(args, "http_port", None),
            grpc_port=getattr(args, "grpc_port", None),
        ),
    )


def settings_of(args: argparse.Namespace) -> GatewayConfig:
    """The configuration, for commands that do not serve (no repository needed)."""
    overrides = Overrides(repository=Path("."), state_dir=args.state_dir, state=args.state)
    return load_config(args.config, overrides)


def state_database(args: argparse.Namespace) -> StateDatabase:
    """The state database, its schema brought up to date (and the files of a gateway
    from before it imported).

    Raises:
        ConfigError: it cannot be opened.
    """
    config = settings_of(args)
    return open_state(config.state_url, legacy_dir=config.state_dir)


def device_registry(args: argparse.Namespace) -> DeviceRegistry:
    return DeviceRegistry(state_database(args))


def state_dir_of(args: argparse.Namespace) -> Path:
    return settings_of(args).state_dir


def ota_dir_of(args: argparse.Namespace) -> Path | None:
    if getattr(args, "repository", None) is not None:
        return Path(args.repository)
    if args.config is not None:
        return settings_of(args).ota_repository
    return None
