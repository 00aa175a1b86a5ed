"""The configuration files that ``tools/config_reference.py`` documents: how each
is loaded, which class documents its top level, and the example, holding every
table, that its loader reads (and the page shows).

A new file is one more :class:`~tools.config_reference.Document` here; a new table
one more table in its example (the check says so when it is missing).
"""

from __future__ import annotations

from collections.abc import Callable

from tools.config_reference import Document

__all__ = ["DOCUMENTS"]


def _agent() -> Document:
    from edge_agent.config import AgentConfig, load_agent_config

    return Document(
        name="agent",
        title="The agent's configuration",
        file="agent.toml",
        intro="""
`edge-agent run --config /etc/edge-agent/agent.toml` (and every `edge-agent` command
that takes `--config`) reads one TOML file. Every field is optional: without a file
the agent runs with the profile it detects, the models installed with it, and no
gateway. Where each part is explained: [the agent as a service](../service.md),
[offload](../offload.md), [OTA updates](../ota.md), [MQTT](../mqtt.md),
[streams](../streams.md), [limits](../limits.md).
""",
        root=AgentConfig,
        load=lambda path, reads: load_agent_config(path, reads=reads),
        example=AGENT_EXAMPLE,
    )


def _gateway() -> Document:
    from cloud_gateway.config import GatewayConfig, load_config

    return Document(
        name="gateway",
        title="The gateway's configuration",
        file="gateway.toml",
        intro="""
`cloud-gateway --config gateway.toml serve` (and every `cloud-gateway` command that
takes `--config`) reads one TOML file; `--state-dir`, `--state` and `serve`'s
`--repository`, `--host`, `--http-port` and `--grpc-port` override it. Every field is
optional but `repository` (here or on the command line). Where each part is
explained: [the gateway](../gateway.md),
[the dashboard](../dashboard.md), [deployment](../deployment.md),
[limits and timeouts](../limits.md).
""",
        root=GatewayConfig,
        load=lambda path, reads: load_config(path, reads=reads),
        example=GATEWAY_EXAMPLE,
        classes={"models.MODEL.batching": None},
        like={"models.MODEL.batching": "batching"},
    )


def _policy() -> Document:
    from edge_agent.policy.rules import ModelRule, PolicyRules, load_policy

    return Document(
        name="policy",
        title="The policy file",
        file="policy.toml",
        intro="""
The offload policy: what may leave the device, where each model runs, and how the
device's state and a request's deadline weigh in ([policy and privacy](../policy.md)).
The agent's configuration names it (`policy = "policy.toml"`); without one the agent
follows the built-in policy, `edge_agent/policy/default.toml`, the file to copy to
start your own (`edge-agent policy show` prints the policy in use, `edge-agent policy
check FILE` checks a file). Every field is optional.

??? example "The built-in policy"

    ```toml
    --8<-- "edge_agent/policy/default.toml"
    ```
""",
        root=PolicyRules,
        load=lambda path, reads: load_policy(path, reads=reads),
        example=POLICY_EXAMPLE,
        classes={"models": None, "models.MODEL": ModelRule},
    )


POLICY_EXAMPLE = """\
version = 1

[sensitivity]
public = "free"
personal = "redact"
sensitive = "local"

[defaults]
placement = "either"

[models.MODEL]
placement = "either"
escalate_to = "digits-heavy"
escalate_below = 0.9

[device]
max_cpu_load = 0.9

[deadline]
margin_ms = 2.0

[redaction]
mode = "pixelate"

[pictures]
format = "jpeg"
quality = 90
"""

AGENT_EXAMPLE = """\
device_id = "cam-01"
model_dir = "models"
state_dir = "/var/lib/edge-agent"

[gateway]
address = "gateway.example:8001"
protocol = "grpc"

[gateway.tls]
ca = "ca.pem"

[breaker]
failures = 3

[privacy]
detector = "centerface"

[ota]
bundle = "cam-01.json"
interval_s = 3600

[mqtt]
host = "broker.example"
port = 8883

[mqtt.tls]
ca = "ca.pem"

[telemetry]
interval_s = 30

[api]
http_port = 8080
grpc_port = 8081

[limits]
max_request_rows = 32

[thermal]
enabled = true

[logging]
format = "json"

[[streams]]
name = "door"
source = "/dev/video0"
model = "face-detection-short-range"
sink = "mqtt"
"""

GATEWAY_EXAMPLE = """\
repository = "models"
state_dir = "gateway-state"
ota_repository = "ota"
http_port = 8000
grpc_port = 8001

[tls]
cert = "server.pem"
key = "server.key"

[rate_limit]
requests_per_second = 50
burst = 100

[batching]
max_batch_size = 32

[models.MODEL.batching]
max_batch_size = 64

[metrics]
public = false

[connections]
max_connections = 1000

[mqtt]
host = "broker.example"
port = 8883

[mqtt.tls]
ca = "ca.pem"

[dashboard]
enabled = true

[[backends]]
url = "grpcs://engine.example:8001"
models = ["ppocr-det"]

[backends.tls]
ca = "ca.pem"
"""

DOCUMENTS: tuple[Callable[[], Document], ...] = (_agent, _gateway, _policy)
