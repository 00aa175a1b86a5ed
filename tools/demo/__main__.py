"""``python -m tools.demo``: run the parts in order; clean up whatever happens."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType

from edge_core.repository import ModelRepository

from .common import MODELS, DemoError, mosquitto_installed, tail
from .inputs import choose_inputs
from .loopback import Demo
from .variants import show_variants

KEPT = (
    ("gateway.toml", "the gateway's configuration (cloud-gateway --config gateway.toml serve)"),
    ("agent.toml", "the agent's configuration (edge-agent run --config agent.toml)"),
    ("broker/mosquitto.conf", "the broker's configuration, with its passwd and acl files"),
    ("keys", "the OTA signing keys (private: 0600)"),
    ("ota", "the signed OTA repository"),
    ("gateway-state", "device tokens (hashed), group keys, rollouts"),
)


def keep(work: Path) -> None:
    """Say where what the demo built is, for an operator to start from."""
    print(f"\nkept {work}:")
    for name, what in KEPT:
        if (work / name).exists():
            print(f"  {work / name}  {what}")
    for bundle in sorted(work.glob("*.json")):
        print(f"  {bundle}  an enrollment bundle (0600): token, group key, trusted root")
    print(
        "  the ports in them were free during the demo; run the commands from that folder, "
        "and remove it when done"
    )


def run(no_mqtt: bool, keep_work: bool = False) -> int:
    started = time.monotonic()
    mqtt_off = "--no-mqtt" if no_mqtt else "mosquitto is not installed"
    mqtt = not no_mqtt and mosquitto_installed()
    print(
        "MQTT: on: mosquitto is installed"
        if mqtt
        else f"MQTT: off ({mqtt_off}): the agent checks for updates every 2 s, no telemetry",
        flush=True,
    )
    with ExitStack() as stack:
        if keep_work:
            work = Path(tempfile.mkdtemp(prefix="edge-demo-"))
            print(f"(working in {work}, kept at the end)\n")
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="edge-demo-")))
            print(f"(working in {work}, removed at the end)\n")
        demo = Demo(work, stack, mqtt)
        try:
            repository = ModelRepository(MODELS)
            inputs = choose_inputs(repository)
            show_variants(repository, inputs, work)
            demo.set_up()
            if mqtt:
                demo.start_broker()
            demo.start_gateway()
            demo.start_agent()
            demo.requests(inputs)
            demo.update(inputs)
            demo.outage(inputs)
        except Exception:
            for name in ("gateway", "agent"):
                if (work / f"{name}.log").exists():
                    print(f"\n{name}.log, the last lines:\n{tail(work / f'{name}.log')}")
            raise
        demo.processes.stop_all()
        # what the summary reports is settled; stop the rest before printing it
        stack.close()
        demo.summary(time.monotonic() - started, mqtt_off, kept=keep_work)
        if keep_work:
            keep(work)
    return 0


@contextmanager
def interrupts_as_keyboard_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP end the demo as Ctrl-C does: through the clean-up."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="A cloud gateway and an edge agent on loopback: every policy decision, "
        "an update over the air, the cloud going away."
    )
    parser.add_argument(
        "--no-mqtt", action="store_true", help="run without a broker even when mosquitto is there"
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the working folder and print the paths of its configurations",
    )
    args = parser.parse_args(argv)
    with interrupts_as_keyboard_interrupt():
        try:
            return run(args.no_mqtt, args.keep)
        except DemoError as exc:
            print(f"\ndemo failed: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("\ninterrupted: everything stopped, the working folder removed", file=sys.stderr)
            return 130


if __name__ == "__main__":
    raise SystemExit(main())
