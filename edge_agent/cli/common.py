"""Helpers shared by the ``edge-agent`` subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from edge_agent import profiles
from edge_agent.assemble import resolve_profile as resolve_config_profile
from edge_agent.cli import PROG
from edge_agent.config import AgentConfig, load_agent_config
from edge_agent.profiles import Detection, DeviceProfile, ProfileStore
from edge_core.errors import EdgeError
from edge_core.paths import default_model_dir, default_profiles_dir

__all__ = [
    "PROG",
    "CliError",
    "add_model_dir",
    "add_profiles_dir",
    "agent_settings",
    "existing_model_dir",
    "print_json",
    "resolve_profile",
]


class CliError(EdgeError):
    """A command-line argument names something that is not there."""


def add_model_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help=f"model repository (default: {default_model_dir()})",
    )


def existing_model_dir(path: Path) -> Path:
    """``path``, checked: a command that reads models from a folder that is not
    there would only say that it found none.

    Raises:
        CliError: ``path`` does not exist or is not a folder.
    """
    if not path.is_dir():
        what = "is not a folder" if path.exists() else "does not exist"
        raise CliError(f"model folder {path} {what}")
    return path


def add_profiles_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profiles-dir",
        type=Path,
        default=None,
        help=f"device profiles (default: {default_profiles_dir()})",
    )


def profile_store(args: argparse.Namespace) -> ProfileStore:
    return ProfileStore(args.profiles_dir or default_profiles_dir())


def resolve_profile(args: argparse.Namespace) -> tuple[DeviceProfile, Detection | None]:
    """The profile named by ``--profile``, else the detected one (under ``--root``)."""
    return profiles.resolve_profile(
        getattr(args, "profile", None),
        root=Path(getattr(args, "root", None) or "/"),
        profiles_dir=getattr(args, "profiles_dir", None),
    )


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


def agent_settings(args: argparse.Namespace) -> tuple[AgentConfig, DeviceProfile]:
    """The agent configuration (``--config``) with ``--model-dir`` and ``--profile``
    applied, and the device profile: named (by flag or configuration) or detected.

    Raises:
        CliError: the model folder is not there.
        ConfigError: the configuration or the profile is wrong.
    """
    config = load_agent_config(getattr(args, "config", None))
    if getattr(args, "model_dir", None) is not None:
        config = replace(config, model_dir=args.model_dir)
    existing_model_dir(config.model_dir)
    if getattr(args, "profile", None):
        config = replace(config, profile=args.profile)
    if getattr(args, "profiles_dir", None) is not None:
        config = replace(config, profiles_dir=args.profiles_dir)
    return config, resolve_config_profile(config)
