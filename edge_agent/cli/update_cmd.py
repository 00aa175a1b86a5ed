"""``edge-agent update`` and ``edge-agent models rollback``: over-the-air updates by hand."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from edge_agent.cli.account import run_as_state_owner
from edge_agent.cli.common import PROG, CliError, print_json
from edge_agent.config import load_agent_config


def register(commands: Any, models: Any) -> None:
    update = commands.add_parser("update", help="check for model updates now and install them")
    update.add_argument("--config", type=Path, required=True, help="agent configuration with [ota]")
    update.add_argument("--quiet", action="store_true", help="no progress bar")
    update.set_defaults(run=_update)

    rollback = models.add_parser("rollback", help="go back to the previous version of a model")
    rollback.add_argument("name")
    rollback.add_argument(
        "--config", type=Path, required=True, help="agent configuration with [ota]"
    )
    rollback.set_defaults(run=_rollback)


def size(count: int) -> str:
    """A byte count as a person reads it: 812 B, 23.4 kB, 50.0 MB, 1.20 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}" if unit == "GB" else f"{count / scale:.1f} {unit}"
    return f"{count} B"


class ProgressBar:
    """A one-line progress bar on stderr."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}

    def __call__(self, name: str, done: int, total: int) -> None:
        start = self.started.setdefault(name, time.monotonic())
        elapsed = time.monotonic() - start
        width = 30
        filled = int(width * done / max(total, 1))
        bar = "#" * filled + "." * (width - filled)
        # a rate over less than a tenth of a second says nothing (a small model is
        # "done" in its first read)
        rate = f" {size(int(done / elapsed))}/s" if elapsed >= 0.1 else ""
        sys.stderr.write(f"\r{name}: [{bar}] {size(done)}/{size(total)}{rate}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _updater(args: argparse.Namespace, command: str, progress: Any = None) -> Any:
    """The updater of ``--config``, run as the service's account (:mod:`.account`)."""
    from edge_agent.assemble import create_updater, resolve_profile

    config = load_agent_config(args.config)
    if config.ota is None:
        raise CliError(f"{args.config} has no [ota] section")
    run_as_state_owner(config.ota.state_dir, f"{PROG} {command}")
    return create_updater(
        config, resolve_profile(config), on_progress=progress or (lambda name, done, total: None)
    )


def _update(args: argparse.Namespace) -> int:
    updater = _updater(args, "update", None if args.quiet else ProgressBar())
    try:
        outcomes = updater.check()
    finally:
        updater.close()
    print_json({"outcomes": [o.to_dict() for o in outcomes]})
    return 1 if any(o.status in ("failed", "refused") for o in outcomes) else 0


def _rollback(args: argparse.Namespace) -> int:
    updater = _updater(args, "models rollback")
    try:
        previous = updater.rollback(args.name)
    finally:
        updater.close()
    print(f"{args.name}: back to version {previous.version} ({previous.source})")
    return 0
