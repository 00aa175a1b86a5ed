"""``edge-agent service install``: run the agent under systemd.

Renders ``edge-agent.service`` for this interpreter and configuration, writes
it into systemd's unit directory (or prints it with ``--dry-run``), and prints
the ``systemctl`` commands that load and start it. It does not run them:
enabling a service is the operator's decision, and the install step is often
part of building an image where systemd is not running.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from edge_agent.cli.common import PROG, CliError
from edge_agent.service.unit import (
    DEFAULT_CONFIG,
    DEFAULT_GROUPS,
    DEFAULT_UNIT_DIR,
    HIDDEN_DIRS,
    UNIT_NAME,
    install_unit,
    render_unit,
)

UNIT = UNIT_NAME.removesuffix(".service")


def register(commands: Any) -> None:
    parser = commands.add_parser("service", help="run the agent as a systemd service")
    sub = parser.add_subparsers(dest="service_command", metavar="ACTION", required=True)

    install = sub.add_parser(
        "install", help="write the systemd unit and print the commands that start it"
    )
    install.add_argument(
        "--dry-run", action="store_true", help="print the unit instead of writing it"
    )
    install.add_argument(
        "--unit-dir",
        type=Path,
        default=DEFAULT_UNIT_DIR,
        help=f"where to write {UNIT_NAME} (default: {DEFAULT_UNIT_DIR})",
    )
    install.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        help=f"the agent configuration the service loads (default: {DEFAULT_CONFIG})",
    )
    install.add_argument(
        "--user",
        default=None,
        help="run as this existing account (default: a dynamic user; "
        "power modes need root: --user root)",
    )
    install.add_argument(
        "--group",
        dest="groups",
        action="append",
        default=[],
        metavar="NAME",
        help=f"a supplementary group besides {' and '.join(DEFAULT_GROUPS)}, "
        "e.g. apex for an Edge TPU (repeatable)",
    )
    install.add_argument(
        "--python",
        default=sys.executable,
        help=f"the interpreter the service runs (default: this one, {sys.executable})",
    )
    install.set_defaults(run=_install)


def _install(args: argparse.Namespace) -> int:
    python = args.python
    if not os.path.isabs(python):
        raise CliError(f"--python {python!r} is relative; expected an absolute path")
    # a dry run prints the unit whatever it finds, with what an install refuses as warnings
    warnings: list[str] | None = [] if args.dry_run else None
    _check_resolved(python, warnings)
    # A relative --config means "this file here"; the service starts in /.
    config = Path(os.path.abspath(args.config))
    text = render_unit(python, config, args.user, groups=args.groups, warnings=warnings)
    for warning in warnings or ():
        print(f"{PROG}: warning: {warning}; an install would refuse it", file=sys.stderr)
    target = install_unit(text, args.unit_dir, dry_run=args.dry_run)
    commands = [
        "systemctl daemon-reload",
        f"systemctl enable --now {UNIT_NAME}",
        f"systemctl status {UNIT_NAME}",
        f"journalctl -u {UNIT} -f",
    ]
    if args.dry_run:
        # Comments after the unit: the output stays a valid unit file when redirected.
        sys.stdout.write(text)
        print(f"\n# would write {target}, then run:")
        for command in commands:
            print(f"#   {command}")
        return 0
    print(f"wrote {target}")
    if not config.is_file():
        print(f"note: {config} does not exist yet; the service fails to start until it does")
    print("now run:")
    for command in commands:
        print(f"  {command}")
    return 0


def _check_resolved(python: str, warnings: list[str] | None) -> None:
    """Refuse an interpreter whose links lead where the sandbox hides (a pyenv under /home):
    the unit would fail at start with status 203/EXEC and no reason. With ``warnings``
    (a dry run), say so there instead."""
    real = os.path.realpath(python)
    if not os.path.exists(real):
        return  # rendering for another machine: nothing to check here
    for hidden in HIDDEN_DIRS:
        if real == hidden or real.startswith(hidden + "/"):
            message = (
                f"--python {python} resolves to {real}, under {hidden}, which the service's "
                f"sandbox hides; expected an interpreter installed outside "
                f"{', '.join(HIDDEN_DIRS)} (e.g. a virtual environment made from "
                "/usr/bin/python3 under /opt/edge-agent: docs/install.md)"
            )
            if warnings is None:
                raise CliError(message)
            warnings.append(message)
            return
