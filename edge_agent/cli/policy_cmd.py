"""``edge-agent policy explain|show|check``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from edge_agent.agent import DEFAULT_POLICY
from edge_agent.assemble import create_agent
from edge_agent.cli.common import add_model_dir, add_profiles_dir, agent_settings, print_json
from edge_agent.cli.infer_cmd import agent_input
from edge_agent.config import load_agent_config
from edge_agent.policy import load_policy
from edge_agent.policy.rules import LABELS


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "policy", help="the offload policy: explain a decision, show the rules"
    )
    sub = parser.add_subparsers(dest="policy_command", metavar="ACTION", required=True)

    explain = sub.add_parser(
        "explain", help="print where a request would run and why, without running it"
    )
    explain.add_argument("--model", required=True)
    explain.add_argument("--input", required=True, type=Path, help=".npy, .npz or an image file")
    explain.add_argument("--label", choices=LABELS, help="the data's sensitivity")
    explain.add_argument("--deadline-ms", type=float, help="the request's deadline")
    explain.add_argument("--config", type=Path, help="agent configuration (gateway, policy)")
    explain.add_argument(
        "--profile", help="device profile (default: the configured or detected one)"
    )
    add_model_dir(explain)
    add_profiles_dir(explain)
    explain.set_defaults(run=_explain)

    show = sub.add_parser("show", help="print the policy in use as JSON")
    show.add_argument("--config", type=Path, help="agent configuration naming the policy file")
    show.set_defaults(run=_show)

    check = sub.add_parser("check", help="validate a policy file")
    check.add_argument("file", type=Path)
    check.set_defaults(run=_check)


def _explain(args: argparse.Namespace) -> int:
    config, profile = agent_settings(args)
    agent = create_agent(config, profile=profile)
    try:
        decision, findings = agent.explain(
            args.model, agent_input(agent, args), label=args.label, deadline_ms=args.deadline_ms
        )
    finally:
        agent.close()
    print_json({**decision.to_dict(), "findings": findings.to_dict(), "profile": profile.id})
    return 0


def _show(args: argparse.Namespace) -> int:
    config = load_agent_config(args.config)
    path = config.policy or DEFAULT_POLICY
    print_json({"file": str(path), **load_policy(path).to_dict()})
    return 0


def _check(args: argparse.Namespace) -> int:
    load_policy(args.file)
    print(f"{args.file}: valid")
    return 0
