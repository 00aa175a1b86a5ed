"""Run one update check as a device would, in its own process: for the power-loss tests.

    python tests/ota_installer.py BUNDLE STATE_DIR URL [--crash-at STEP|list]
                                 [--pause-at STEP --gate FILE]

``--crash-at STEP`` kills this process with SIGKILL when the updater reaches
STEP (a power cut there); ``--crash-at list`` prints every step instead.
``--pause-at STEP`` stops there, creates ``FILE.reached`` and waits until
``FILE`` exists (to hold one updater mid-install while another starts).
Otherwise the outcomes are printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge_agent.ota import OtaUpdater, UpdateSettings, load_bundle
from edge_agent.paths import default_profiles_dir
from edge_agent.profiles import ProfileStore


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle", type=Path)
    parser.add_argument("state", type=Path)
    parser.add_argument("url")
    parser.add_argument("--crash-at")
    parser.add_argument("--pause-at")
    parser.add_argument("--gate", type=Path)
    args = parser.parse_args()

    def on_step(step: str) -> None:
        if args.crash_at == "list":
            print(step, flush=True)
        elif step == args.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == args.pause_at:
            args.gate.with_name(args.gate.name + ".reached").touch()
            deadline = time.monotonic() + 60
            while not args.gate.exists() and time.monotonic() < deadline:
                time.sleep(0.02)

    updater = OtaUpdater(
        UpdateSettings(url=args.url, state_dir=args.state, attempts=1),
        load_bundle(args.bundle),
        ProfileStore(default_profiles_dir()).get("raspberry-pi-5"),
        on_step=on_step,
    )
    outcomes = updater.check()
    if args.crash_at != "list":
        print(json.dumps([o.to_dict() for o in outcomes]))
    failed = [o for o in outcomes if o.status == "failed"]
    for outcome in failed:
        print(f"{outcome.name}: {outcome.detail}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
