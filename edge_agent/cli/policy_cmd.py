"""``edge-agent policy explain|show|check``."""

from __future__ import annotations

import argparse
import http.client
import json
import socket
from pathlib import Path
from typing import Any

from edge_agent.agent import DEFAULT_POLICY
from edge_agent.assemble import create_agent
from edge_agent.cli.common import (
    CliError,
    add_model_dir,
    add_profiles_dir,
    agent_settings,
    print_json,
)
from edge_agent.cli.infer_cmd import agent_input, read_input
from edge_agent.config import AgentConfig, load_agent_config
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
        "--service",
        action="store_true",
        help="ask the running service (edge-agent run) of the configuration: its decision "
        "knows what it has learnt (the link's round trip and bandwidth, the models' "
        "latency, what the cloud has)",
    )
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
    if args.service:
        print_json(explain_by_service(config, args))
        return 0
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


def explain_by_service(config: AgentConfig, args: argparse.Namespace) -> dict[str, Any]:
    """The running service's explanation of the request (``POST
    /v2/models/NAME/explain`` on its local API, over its socket or loopback port).

    Raises:
        CliError: the service cannot be reached, or refused the request (its message).
    """
    from edge_core.protocol.rest import HEADER_LENGTH, encode_infer_request
    from edge_core.protocol.types import InferRequest
    from edge_core.repository import ModelRepository
    from edge_core.tensors import datatype_of

    package = ModelRepository(config.model_dir).get(args.model)
    arrays = read_input(package, args.input, max_pixels=config.limits.max_image_pixels)
    parameters: dict[str, Any] = {}
    if args.deadline_ms:
        parameters["timeout"] = int(args.deadline_ms * 1000)
    request = InferRequest(
        inputs=arrays,
        datatypes={name: datatype_of(a.dtype) for name, a in arrays.items()},
        parameters=parameters,
    )
    body, header_length = encode_infer_request(request)
    headers = {"Content-Type": "application/octet-stream"}
    if header_length is not None:
        headers[HEADER_LENGTH] = str(header_length)
    if args.label:
        headers["X-Edge-Label"] = args.label
    connection = _connection(config)
    try:
        connection.request("POST", f"/v2/models/{args.model}/explain", body, headers)
        response = connection.getresponse()
        document = json.loads(response.read() or b"{}")
    except (OSError, ValueError) as exc:
        raise CliError(f"the service could not be asked ({_where(config)}): {exc}") from None
    finally:
        connection.close()
    if response.status != 200:
        raise CliError(f"the service refused ({response.status}): {document.get('error')}")
    return dict(document)


def _connection(config: AgentConfig) -> http.client.HTTPConnection:
    api = config.api
    if api.socket is not None:
        return _UnixConnection(str(api.socket))
    if not api.http_port:
        raise CliError("the service has no HTTP API ([api] http_port = 0)")
    host = "127.0.0.1" if api.host in ("0.0.0.0", "::", "") else api.host
    return http.client.HTTPConnection(host, api.http_port, timeout=30)


def _where(config: AgentConfig) -> str:
    api = config.api
    return str(api.socket) if api.socket is not None else f"{api.host}:{api.http_port}"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)
