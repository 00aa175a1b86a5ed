"""Run one update check as a device would, in its own process: for the power-loss tests.

    python tests/support/ota_installer.py BUNDLE STATE_DIR URL [--crash-at N | --list-steps]
                                 [--pause-at STEP --gate FILE]
                                 [--file-limit-at STEP --file-limit BYTES]

``--crash-at N`` kills this process with SIGKILL at the N-th step (counted
from 0 over the whole check, every model's steps in turn: step names repeat
from one model to the next, their indices do not), a power cut there;
``--list-steps`` prints every step instead, one a line, in that order.
``--pause-at STEP`` stops there, creates ``FILE.reached`` and waits until
``FILE`` exists (to hold one updater mid-install while another starts).
``--file-limit-at STEP`` lowers this process's file-size limit (``ulimit -f``)
to ``--file-limit`` bytes there: a disk that fills up during the download.
Otherwise the outcomes are printed as JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from edge_agent.config import OtaSettings
from edge_agent.ota import OtaUpdater, load_bundle
from edge_agent.profiles import ProfileStore
from edge_core.paths import default_profiles_dir


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle", type=Path)
    parser.add_argument("state", type=Path)
    parser.add_argument("url")
    parser.add_argument("--crash-at", type=int)
    parser.add_argument("--list-steps", action="store_true")
    parser.add_argument("--pause-at")
    parser.add_argument("--gate", type=Path)
    parser.add_argument("--file-limit-at")
    parser.add_argument("--file-limit", type=int)
    args = parser.parse_args()

    steps = itertools.count()

    def on_step(step: str) -> None:
        index = next(steps)
        if args.list_steps:
            print(step, flush=True)
        elif index == args.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == args.file_limit_at:
            hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
            resource.setrlimit(resource.RLIMIT_FSIZE, (args.file_limit, hard))
        if step == args.pause_at:
            args.gate.with_name(args.gate.name + ".reached").touch()
            deadline = time.monotonic() + 60
            while not args.gate.exists() and time.monotonic() < deadline:
                time.sleep(0.02)

    updater = OtaUpdater(
        OtaSettings(state_dir=args.state, url=args.url, attempts=1),
        load_bundle(args.bundle),
        ProfileStore(default_profiles_dir()).get("raspberry-pi-5"),
        on_step=on_step,
    )
    outcomes = updater.check()
    if not args.list_steps:
        print(json.dumps([o.to_dict() for o in outcomes]))
    failed = [o for o in outcomes if o.status == "failed"]
    for outcome in failed:
        print(f"{outcome.name}: {outcome.detail}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
