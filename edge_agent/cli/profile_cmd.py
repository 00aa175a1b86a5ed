"""``edge-agent profile detect|show|list|apply``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from edge_agent.cli.common import PROG, add_profiles_dir, print_json, profile_store
from edge_agent.profiles import apply_plan, detect_profile, plan_power_mode


def register(commands: Any) -> None:
    parser = commands.add_parser("profile", help="detect, show and apply device profiles")
    sub = parser.add_subparsers(dest="profile_command", metavar="ACTION", required=True)

    detect = sub.add_parser("detect", help="print the profile that fits this device, as JSON")
    detect.add_argument("--root", type=Path, default=Path("/"), help="filesystem root to inspect")
    add_profiles_dir(detect)
    detect.set_defaults(run=_detect)

    show = sub.add_parser("show", help="print a profile as JSON")
    show.add_argument("name")
    add_profiles_dir(show)
    show.set_defaults(run=_show)

    listing = sub.add_parser("list", help="list the known profiles")
    add_profiles_dir(listing)
    listing.set_defaults(run=_list)

    apply = sub.add_parser("apply", help="apply a profile's power mode")
    apply.add_argument("name")
    apply.add_argument("--mode", help="power mode (default: the profile's default)")
    apply.add_argument(
        "--root", type=Path, default=Path("/"), help="filesystem root to write under"
    )
    apply.add_argument(
        "--dry-run", action="store_true", help="print what would be done, do nothing"
    )
    add_profiles_dir(apply)
    apply.set_defaults(run=_apply)


def _detect(args: argparse.Namespace) -> int:
    detection = detect_profile(list(profile_store(args)), args.root)
    print_json(detection.to_dict())
    return 0


def _show(args: argparse.Namespace) -> int:
    print_json(profile_store(args).get(args.name).to_dict())
    return 0


def _list(args: argparse.Namespace) -> int:
    for profile in profile_store(args):
        print(f"{profile.id:20} {profile.arch:8} {profile.description}")
    return 0


def _apply(args: argparse.Namespace) -> int:
    profile = profile_store(args).get(args.name)
    mode = profile.power_mode(args.mode)
    warnings: list[str] | None = [] if args.dry_run else None
    plan = plan_power_mode(profile, mode.name, args.root, warnings=warnings)
    verb = "would" if args.dry_run else "will"
    print(f"power mode {mode.name!r} of {profile.id}: {len(plan)} step(s)")
    for action in plan:
        print(f"  {verb} {action.describe()}")
    for warning in warnings or ():
        print(f"{PROG}: warning: {warning} (a real run would fail here)", file=sys.stderr)
    if not args.dry_run:
        apply_plan(plan)
        print("applied")
    return 0
