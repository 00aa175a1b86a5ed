"""``edge-agent run``: the agent as a service (see :mod:`edge_agent.service.daemon`)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from edge_agent.cli.account import run_as_state_owner
from edge_agent.cli.common import PROG
from edge_core.errors import EdgeError

__all__ = ["register"]


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "run", help="serve the local inference API (the systemd service's command)"
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="agent configuration (TOML); default: the detected profile, the sample models, "
        "local only, the API on 127.0.0.1:8080 (HTTP) and :8081 (gRPC)",
    )
    parser.add_argument("--http-port", type=int, help="local API HTTP port (0: none)")
    parser.add_argument("--grpc-port", type=int, help="local API gRPC port (0: none)")
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from edge_agent.service.daemon import Daemon
    from edge_agent.service.logs import setup_logging

    daemon = Daemon(args.config, http_port=args.http_port, grpc_port=args.grpc_port)
    config = daemon.load_config()  # a wrong file fails here, before anything starts
    run_as_state_owner(config.state_dir, f"{PROG} run")  # as the service's account
    setup_logging(config.logging.format, "debug" if args.debug else config.logging.level)
    try:
        return daemon.run()
    except EdgeError as exc:  # from here on, in the log's format (a JSON line by default)
        logging.getLogger("edge_agent").error("the agent stopped: %s", exc)
        return 1
