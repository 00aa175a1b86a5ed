"""``cloud-gateway rollout start|status|pause|resume|abort``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cloud_gateway.cli.common import state_database
from edge_core.errors import EdgeError

__all__ = ["register"]


def register(commands: Any) -> None:
    rollout = commands.add_parser("rollout", help="staged rollouts of published models")
    rollout_commands = rollout.add_subparsers(
        dest="rollout_command", metavar="ACTION", required=True
    )
    start = rollout_commands.add_parser("start", help="deploy a version to a share of a group")
    start.add_argument("--name", required=True)
    start.add_argument("--version", type=int, required=True)
    start.add_argument("--group", required=True)
    start.add_argument("--percent", type=float, required=True)
    start.add_argument(
        "--failure-threshold", type=float, default=0.2, help="failed share that pauses it"
    )
    start.set_defaults(run=_rollout_start)
    status = rollout_commands.add_parser("status", help="rollouts and their reports")
    status.add_argument("--name")
    status.add_argument(
        "--devices", action="store_true", help="each device's report, with its reason"
    )
    status.set_defaults(run=_rollout_status)
    for action, state in (("pause", "paused"), ("resume", "active"), ("abort", "aborted")):
        command = rollout_commands.add_parser(action, help=f"{action} rollouts of a model")
        command.add_argument("--name", required=True)
        command.add_argument("--version", type=int)
        command.add_argument("--group")
        command.set_defaults(run=_rollout_state(state))


def _rollouts(args: argparse.Namespace) -> Any:
    from cloud_gateway.ota.rollouts import RolloutStore

    return RolloutStore(state_database(args))


def _rollout_start(args: argparse.Namespace) -> int:
    store = _rollouts(args)
    try:
        rollout = store.start(
            args.name,
            args.version,
            args.group,
            args.percent,
            failure_threshold=args.failure_threshold,
        )
    except ValueError as exc:
        raise EdgeError(str(exc)) from None
    print(
        f"rollout of {rollout.name} v{rollout.version} to {rollout.percent:g}% of "
        f"{rollout.group}: {rollout.state}"
    )
    print(
        "devices in its slice install it at their next update check: at once when they "
        "hear the broker's announcement (an [mqtt] section, and a gateway bridging it), "
        "else at their next periodic check (every [ota] interval_s, 3600 s by default, "
        "plus up to jitter_s) or when the agent starts. To check now on a device: "
        "sudo edge-agent update --config /etc/edge-agent/agent.toml (it runs as the "
        "service's account; the running agent takes the new version within a second). "
        "Watch it: cloud-gateway rollout status --devices"
    )
    return 0


def _rollout_status(args: argparse.Namespace) -> int:
    import time

    from cloud_gateway.ota.checks import CheckStore, describe_failing
    from cloud_gateway.ota.rollouts import in_slice

    store = _rollouts(args)
    rollouts = store.all(args.name)
    if not rollouts:
        print("no rollouts")
    failing = CheckStore(store.database).failing_devices() if rollouts else []
    now = time.time()
    for r in rollouts:
        stats = store.stats(r.name, r.version, r.group)
        reason = f"  ({r.reason})" if r.reason else ""
        # the devices of its slice whose checks fail: they report nothing of this version
        stuck = [
            c for c in failing if c["group"] == r.group and in_slice(c["device"], r.name, r.percent)
        ]
        print(
            f"{r.name:20} v{r.version:<4} {r.group:16} {r.percent:5g}%  {r.state:8} "
            f"installed {stats['installed']}, failed {stats['failed']}, "
            f"rolled back {stats['rolled_back']}, refused {stats['refused']}"
            + (f", update checks failing on {len(stuck)}" if stuck else "")
            + reason
        )
        reports = store.reports(r.name, r.version, r.group) if args.devices else []
        for report in reports:
            print(f"    {report['device']:24} {report['status']:11} {report['detail']}")
        for check in stuck:
            print(f"    device {check['device']}: {describe_failing(check, now)}")
        if args.devices and not reports and not stuck:
            print("    no device has reported yet")
    return 0


def _rollout_state(state: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            changed = _rollouts(args).set_state(
                args.name, args.version, args.group, state, f"set to {state} by an operator"
            )
        except KeyError as exc:
            raise EdgeError(str(exc.args[0])) from None
        for r in changed:
            print(f"rollout of {r.name} v{r.version} to {r.group}: {r.state}")
        if state == "aborted":
            versions = sorted({r.version for r in changed})
            print(
                "note: devices that installed "
                + ", ".join(f"v{v}" for v in versions)
                + " keep running it until it is withdrawn in the signed metadata: "
                + "; ".join(
                    f"cloud-gateway models withdraw --repository OTA_DIR --keys DIR "
                    f"--name {args.name} --version {v}"
                    for v in versions
                ),
                file=sys.stderr,
            )
        return 0

    return run
