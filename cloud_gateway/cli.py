"""The ``cloud-gateway`` command line.

    cloud-gateway serve --repository DIR [--host H] [--http-port P] [--grpc-port P] [--config FILE]
    cloud-gateway device add DEVICE_ID --group GROUP [--admin] [--replace]
    cloud-gateway device revoke DEVICE_ID
    cloud-gateway device list
    cloud-gateway bench [--json FILE] [--chart FILE]

Errors exit 1 with one line on stderr (``--debug`` adds the traceback).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from cloud_gateway.auth import DeviceRegistry
from cloud_gateway.config import GatewayConfig, load_config
from edge_agent.errors import EdgeError

__all__ = ["main"]

PROG = "cloud-gateway"
log = logging.getLogger(PROG)


def _config(args: argparse.Namespace) -> GatewayConfig:
    return load_config(
        args.config,
        repository=getattr(args, "repository", None),
        state_dir=args.state_dir,
        host=getattr(args, "host", None),
        http_port=getattr(args, "http_port", None),
        grpc_port=getattr(args, "grpc_port", None),
    )


def _registry(args: argparse.Namespace) -> DeviceRegistry:
    if args.config is not None:
        return DeviceRegistry(load_config(args.config, repository=Path(".")).devices_file)
    return DeviceRegistry(
        (args.state_dir or GatewayConfig(repository=Path(".")).state_dir) / "devices.json"
    )


def _serve(args: argparse.Namespace) -> int:
    from cloud_gateway.server import Gateway

    gateway = Gateway(_config(args))
    asyncio.run(gateway.serve_forever())
    return 0


def _device_add(args: argparse.Namespace) -> int:
    registry = _registry(args)
    try:
        token = registry.add(
            args.device_id,
            args.group,
            role="admin" if args.admin else "device",
            replace=args.replace,
        )
    except ValueError as exc:
        raise EdgeError(str(exc)) from None
    print(f"device {args.device_id} (group {args.group}) added to {registry.path}", file=sys.stderr)
    print("its token, shown only this once (the gateway stores a hash):", file=sys.stderr)
    print(token)
    return 0


def _device_revoke(args: argparse.Namespace) -> int:
    try:
        _registry(args).revoke(args.device_id)
    except KeyError as exc:
        raise EdgeError(str(exc.args[0])) from None
    print(f"device {args.device_id} revoked")
    return 0


def _device_list(args: argparse.Namespace) -> int:
    for device in _registry(args).devices():
        state = "revoked" if device.revoked else "active"
        print(f"{device.id:24} {device.group:20} {device.role:7} {state:8} {device.created}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from cloud_gateway.bench import run_from_args

    return run_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="The cloud gateway: Open Inference Protocol over REST and gRPC."
    )
    parser.add_argument("--debug", action="store_true", help="verbose logs and tracebacks")
    parser.add_argument("--config", type=Path, help="gateway configuration file (TOML)")
    parser.add_argument(
        "--state-dir", type=Path, help="where devices.json lives (default: gateway-state)"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser("serve", help="serve a model repository")
    serve.add_argument("--repository", type=Path, help="model repository directory")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--http-port", type=int, help="REST port (default 8000)")
    serve.add_argument("--grpc-port", type=int, help="gRPC port (default 8001)")
    serve.set_defaults(run=_serve)

    device = commands.add_parser("device", help="manage device tokens")
    device_commands = device.add_subparsers(dest="device_command", metavar="ACTION", required=True)
    add = device_commands.add_parser("add", help="register a device and print its token once")
    add.add_argument("device_id")
    add.add_argument("--group", required=True, help="the device's fleet group")
    add.add_argument("--admin", action="store_true", help="may manage the repository")
    add.add_argument(
        "--replace", action="store_true", help="issue a new token for an existing device"
    )
    add.set_defaults(run=_device_add)
    revoke = device_commands.add_parser("revoke", help="revoke a device's token")
    revoke.add_argument("device_id")
    revoke.set_defaults(run=_device_revoke)
    listing = device_commands.add_parser("list", help="list devices")
    listing.set_defaults(run=_device_list)

    bench = commands.add_parser("bench", help="throughput and latency under concurrent load")
    bench.add_argument("--model", default="digits-heavy")
    bench.add_argument(
        "--repository", type=Path, help="model repository (default: the sample models)"
    )
    bench.add_argument("--variant", default="onnx-int8", help="variant the gateway serves")
    bench.add_argument("--concurrency", default="1,8,32,64", help="client counts")
    bench.add_argument("--seconds", type=float, default=3.0, help="seconds per case")
    bench.add_argument("--threads", type=int, default=2, help="runtime threads per inference")
    bench.add_argument("--workers", type=int, default=1, help="inference threads of the gateway")
    bench.add_argument("--spinning", action="store_true", help="let ONNX Runtime's threads spin")
    bench.add_argument("--max-batch", type=int, default=64, help="max_batch_size with batching on")
    bench.add_argument(
        "--delay-us", type=int, default=0, help="max_queue_delay_us with batching on"
    )
    bench.add_argument("--json", type=Path, help="write the results here")
    bench.add_argument(
        "--chart", type=Path, help="draw throughput and p99 against concurrency (PNG)"
    )
    bench.set_defaults(run=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format=f"{PROG}: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.run(args))
    except (EdgeError, OSError) as exc:
        if args.debug:
            traceback.print_exc()
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
