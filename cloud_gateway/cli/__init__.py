"""The ``cloud-gateway`` command line.

    cloud-gateway serve --repository DIR [--host H] [--http-port P] [--grpc-port P] [--config FILE]
    cloud-gateway device add DEVICE_ID --group GROUP [--admin] [--replace] [--bundle FILE]
    cloud-gateway device revoke DEVICE_ID
    cloud-gateway device list
    cloud-gateway keys init --dir DIR [--force --repository OTA_DIR]
    cloud-gateway keys rotate --dir DIR --role ROLE --repository OTA_DIR
    cloud-gateway models publish --repository OTA_DIR --keys DIR --name N --version V --file MODEL
                                 [--group G ...] [--profile P ...]
    cloud-gateway models withdraw --repository OTA_DIR --keys DIR --name N --version V
    cloud-gateway ota init --repository OTA_DIR --keys DIR
    cloud-gateway ota refresh --repository OTA_DIR --keys DIR   (daily, from a timer)
    cloud-gateway rollout start --name N --version V --group G --percent P
    cloud-gateway rollout status [--name N]
    cloud-gateway rollout pause|resume|abort --name N [--version V] [--group G]
    cloud-gateway mqtt acl --out DIR [--gateway-user NAME]
    cloud-gateway db upgrade                      (the state database's schema, and old files)
    cloud-gateway bench --url HOST:PORT --model M --token T [--protocol grpc|http]
                        [--concurrency 1,8,32] [--seconds S] [--json FILE]

Every command that reads or changes state opens the same database: ``--state URL``,
else the configuration's ``state``, else SQLite in the state directory.

Errors exit 1 with one line on stderr (``--debug`` adds the traceback).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from cloud_gateway.cli import db_cmd, device_cmd, load_cmd, ota_cmd, rollout_cmd, serve_cmd
from edge_core import __version__
from edge_core.cli import moved_benchmark, run_command
from edge_core.errors import EdgeError

__all__ = ["main"]

PROG = "cloud-gateway"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="The cloud gateway: Open Inference Protocol over REST, gRPC and MQTT.",
    )
    parser.add_argument("--debug", action="store_true", help="verbose logs and tracebacks")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--config", type=Path, help="gateway configuration file (TOML)")
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="group keys, bundles, the embedded database (default: gateway-state)",
    )
    parser.add_argument(
        "--state",
        metavar="URL",
        help="the state database (sqlite:///FILE or postgresql://...; default: the "
        "configuration's state, else sqlite:///<state dir>/gateway.sqlite)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve_cmd.register(commands)
    device_cmd.register(commands)
    ota_cmd.register(commands)
    rollout_cmd.register(commands)
    db_cmd.register(commands)
    load_cmd.register(commands)
    return parser


# what `cloud-gateway bench` ran before 0.3.0, now `python -m benchmarks NAME`: by
# its name, or by an option only it had
MOVED_BENCHMARKS = frozenset({"remote", "fleet", "dashboard"})
MOVED_FLAGS = {"--peers": "peers", "--baseline": "peers", "--chart": "gateway"}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    moved = moved_benchmark(argv, PROG, MOVED_BENCHMARKS, MOVED_FLAGS)
    if moved is not None:
        print(f"{PROG}: error: {moved}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format=f"{PROG}: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    if not args.debug:
        # a line a request (httpx: the remote backend) or a migration's every step
        # (alembic) is the libraries' to say at debug level only
        for chatty in ("httpx", "httpcore", "alembic"):
            logging.getLogger(chatty).setLevel(logging.WARNING)
    # an address in use or a file it cannot read is an error of the operator's too
    return run_command(args, prog=PROG, expected=(EdgeError, OSError))
