"""The agent's one configuration object, loaded and validated in one place.

A TOML file; every field is optional (without a file: the detected profile,
the sample models, local only)::

    device_id = "cam-01"
    profile = "raspberry-pi-5"      # default: detected
    root = "/"                      # filesystem root for detection and temperatures
    model_dir = "models"            # relative paths are relative to this file
    policy = "policy.toml"          # default: the built-in policy
    deadline_ms = 1000              # a request's deadline unless it brings its own
    cache_entries = 256             # answers kept for the cached fallback tier

    [gateway]                       # offload; absent: local only
    address = "127.0.0.1:8001"
    protocol = "grpc"               # grpc | http
    token_file = "device.token"     # or token = "..." (the file is better: mode 0600)
    retries = 2
    [gateway.tls]
    ca = "ca.pem"
    cert = "device.pem"
    key = "device.key"

    [breaker]
    failures = 3
    cooldown_s = 5.0

    [privacy]
    face_detector = true            # search pictures for faces (needs the BlazeFace package)

    [ota]                           # over-the-air updates; absent: none
    bundle = "enrollment.json"      # from `cloud-gateway device add` (mode 0600)
    url = "http://127.0.0.1:8000"   # the gateway's REST address (default: the bundle's)
    state_dir = "/var/lib/edge-agent"   # slots, partial downloads, trusted metadata
    interval_s = 3600               # periodic check, plus up to jitter_s at random
    jitter_s = 300
    expiry_slack_s = 0              # accept metadata expired this long ago (no real-time clock)
    bandwidth = 0                   # bytes/s for downloads (0: no cap)
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.fields import Fields, load_document
from edge_agent.offload.base import TLSSettings
from edge_agent.paths import default_model_dir

__all__ = ["AgentConfig", "BreakerConfig", "GatewaySettings", "OtaSettings", "load_agent_config"]


@dataclass(frozen=True)
class GatewaySettings:
    address: str
    protocol: str = "grpc"
    token: str | None = None
    retries: int = 2
    tls: TLSSettings | None = None


@dataclass(frozen=True)
class OtaSettings:
    bundle: Path
    state_dir: Path
    url: str | None = None
    interval_s: float = 3600.0
    jitter_s: float = 300.0
    expiry_slack_s: float = 0.0
    bandwidth: int = 0


@dataclass(frozen=True)
class BreakerConfig:
    failures: int = 3
    cooldown_s: float = 5.0


@dataclass(frozen=True)
class AgentConfig:
    device_id: str = "edge-device"
    profile: str | None = None
    root: Path = Path("/")
    model_dir: Path = field(default_factory=default_model_dir)
    policy: Path | None = None
    deadline_ms: float = 1000.0
    cache_entries: int = 256
    gateway: GatewaySettings | None = None
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    face_detector: bool = True
    ota: OtaSettings | None = None
    source: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _read_token(path: Path, fields: Fields) -> str:
    try:
        mode = path.stat().st_mode
        token = path.read_text().strip()
    except OSError as exc:
        raise fields.fail("token_file", f"cannot read {path}: {exc.strerror}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise fields.fail(
            "token_file", f"{path} is readable by others (mode {oct(mode & 0o777)}); expected 0600"
        )
    if not token:
        raise fields.fail("token_file", f"{path} is empty")
    return token


def load_agent_config(path: Path | None) -> AgentConfig:
    """The configuration in ``path`` (the defaults when ``None``).

    Raises:
        ConfigError: the file is missing or malformed, or a field is wrong.
    """
    if path is None:
        return AgentConfig()
    fields = Fields(load_document(path), path=path)
    base = path.parent

    def resolve(value: str) -> Path:
        candidate = Path(value).expanduser()
        return candidate if candidate.is_absolute() else base / candidate

    defaults = AgentConfig()
    model_dir = fields.string("model_dir", None)
    policy = fields.string("policy", None)
    gateway = None
    if fields.has("gateway"):
        g = fields.table("gateway")
        token = g.string("token", None)
        token_file = g.string("token_file", None)
        if token is not None and token_file is not None:
            raise g.fail("token", "give token or token_file, not both")
        if token_file is not None:
            token = _read_token(resolve(token_file), g)
        tls = None
        if g.has("tls"):
            t = g.table("tls")
            tls = TLSSettings(
                ca=resolve(t.string("ca")) if t.has("ca") else None,
                cert=resolve(t.string("cert")) if t.has("cert") else None,
                key=resolve(t.string("key")) if t.has("key") else None,
                server_name=t.string("server_name", None),
            )
            if (tls.cert is None) != (tls.key is None):
                raise t.fail("cert", "cert and key go together")
            t.done()
        gateway = GatewaySettings(
            address=g.string("address"),
            protocol=g.string("protocol", "grpc", choices=["grpc", "http"]),
            token=token,
            retries=g.integer("retries", 2, minimum=0),
            tls=tls,
        )
        g.done()
    b = fields.table("breaker", None)
    breaker = BreakerConfig(
        failures=b.integer("failures", 3, minimum=1),
        cooldown_s=b.number("cooldown_s", 5.0, minimum=0.0),
    )
    b.done()
    p = fields.table("privacy", None)
    face_detector = p.boolean("face_detector", True)
    p.done()
    ota = None
    if fields.has("ota"):
        o = fields.table("ota")
        ota = OtaSettings(
            bundle=resolve(o.string("bundle")),
            state_dir=resolve(o.string("state_dir", "/var/lib/edge-agent")),
            url=o.string("url", None),
            interval_s=o.number("interval_s", 3600.0, minimum=1.0),
            jitter_s=o.number("jitter_s", 300.0, minimum=0.0),
            expiry_slack_s=o.number("expiry_slack_s", 0.0, minimum=0.0),
            bandwidth=o.integer("bandwidth", 0, minimum=0),
        )
        o.done()
    config = AgentConfig(
        device_id=fields.string("device_id", defaults.device_id),
        profile=fields.string("profile", None),
        root=resolve(fields.string("root", "/")),
        model_dir=resolve(model_dir) if model_dir else defaults.model_dir,
        policy=resolve(policy) if policy else None,
        deadline_ms=fields.number("deadline_ms", defaults.deadline_ms, minimum=1.0),
        cache_entries=fields.integer("cache_entries", defaults.cache_entries, minimum=0),
        gateway=gateway,
        breaker=breaker,
        face_detector=face_detector,
        ota=ota,
        source=path,
    )
    fields.done()
    return config
