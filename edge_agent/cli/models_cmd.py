"""``edge-agent models list``."""

from __future__ import annotations

import argparse
from typing import Any

from edge_agent.cli.common import add_model_dir, existing_model_dir, print_json
from edge_core.paths import default_model_dir
from edge_core.report import render_table
from edge_core.repository import ModelRepository


def register(commands: Any) -> Any:
    """Add ``models``; returns its sub-commands (``update_cmd`` adds ``rollback``)."""
    parser = commands.add_parser("models", help="the models in a repository")
    sub = parser.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="list models, versions and variants")
    add_model_dir(listing)
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(run=_list)
    return sub


def _list(args: argparse.Namespace) -> int:
    repository = ModelRepository(existing_model_dir(args.model_dir or default_model_dir()))
    packages = list(repository.packages())
    if args.json:
        print_json([p.to_dict() for p in packages])
        return 0
    rows = []
    for package in packages:
        for variant in package.variants:
            rows.append(
                [
                    package.name,
                    package.version,
                    package.task,
                    variant.id,
                    round(variant.size / 1024, 1),
                    None if variant.accuracy is None else round(100 * variant.accuracy, 2),
                ]
            )
    if not rows:
        print(f"no models in {repository.root}")
        return 0
    print(render_table(["model", "version", "task", "variant", "size KiB", "accuracy %"], rows))
    return 0
