"""``edge-agent stream``: one camera or video through the agent, its results as JSON
lines on stdout (or in a file), until the source ends or Ctrl-C.

    edge-agent stream --source clip.mp4 --model face-detection-short-range \\
        [--label personal] [--rate 5] [--key-frames 8] [--config agent.toml] [--out FILE]

The streams of a running service are ``[[streams]]`` in its configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from edge_agent.cli.common import PROG, CliError, add_model_dir, add_profiles_dir, agent_settings
from edge_agent.config import StreamSettings

__all__ = ["register"]


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "stream", help="run a camera or a video through the agent, results as JSON lines"
    )
    parser.add_argument("--source", required=True, help="a video file, /dev/videoN or a URL")
    parser.add_argument("--model", required=True, help="a model with image preprocessing")
    parser.add_argument("--label", choices=["public", "personal", "sensitive"])
    parser.add_argument("--rate", type=float, default=0.0, help="frames a second (0: every)")
    parser.add_argument(
        "--key-frames",
        type=float,
        default=0.0,
        help="skip frames that differ from the last inferred by less (0..255; 0: none)",
    )
    parser.add_argument("--deadline-ms", type=float, default=0.0)
    parser.add_argument(
        "--fast", action="store_true", help="read a file as fast as it decodes, not in real time"
    )
    parser.add_argument("--out", type=Path, help="write the results here (default: stdout)")
    parser.add_argument("--config", type=Path, help="agent configuration (gateway, policy)")
    parser.add_argument("--profile", help="device profile (default: detected)")
    add_model_dir(parser)
    add_profiles_dir(parser)
    parser.set_defaults(run=_stream)


def _stream(args: argparse.Namespace) -> int:
    from edge_agent.assemble import create_agent
    from edge_agent.streams import Streams, open_capture
    from edge_agent.streams.source import is_live
    from edge_core.errors import EdgeError

    config, profile = agent_settings(args)
    source = args.source
    if "://" not in source and not source.startswith("/dev/"):
        source = str(Path(source).absolute())
    entry = StreamSettings(
        name="cli",
        source=source,
        model=args.model,
        label=args.label,
        rate=args.rate,
        key_frames=args.key_frames,
        sink=f"jsonl:{args.out.absolute()}" if args.out else "stdout",
        deadline_ms=args.deadline_ms,
        realtime=not args.fast,
    )
    if not is_live(source):  # a file that cannot be read: one line, before anything loads
        try:
            open_capture(source).release()
        except EdgeError as exc:
            raise CliError(str(exc)) from None
    agent = create_agent(replace(config, streams=()), profile=profile)
    try:
        streams = Streams((entry,), agent=lambda: agent, device_id=config.device_id)
        stream = streams.streams["cli"]
        stop = lambda signum, frame: stream.request_stop()  # noqa: E731
        previous = signal.signal(signal.SIGINT, stop), signal.signal(signal.SIGTERM, stop)
        try:
            streams.start()
            stream.join()
            streams.stop(5.0)
        finally:
            signal.signal(signal.SIGINT, previous[0])
            signal.signal(signal.SIGTERM, previous[1])
    finally:
        agent.close()
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # its reader went away: nothing more to say there, at exit too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if stream.error is not None:  # the file could not be read: said in the log already
        raise CliError(f"stream: {stream.error}")
    summary = streams.snapshot()["cli"]
    print(f"{PROG}: stream: {json.dumps(summary['frames'])}", file=sys.stderr)
    offloaded = summary["offloaded"]
    if offloaded["frames"]:
        print(
            f"{PROG}: stream: {offloaded['frames']} frames answered by the cloud, "
            f"{offloaded['bytes_a_frame']:,} bytes a frame on the wire (sent "
            f"{offloaded['bytes_sent']:,}, received {offloaded['bytes_received']:,})",
            file=sys.stderr,
        )
    return 0
