"""edge_agent: run models on the device, decide per request where they run.

The public API is what ``__all__`` lists; everything else is internal. The
names are loaded when first used (PEP 562), so that ``import
edge_agent.config`` or ``import edge_agent.cli`` does not load the agent, its
policy, privacy and offload modules with it::

    from edge_agent import create_agent, load_agent_config

    agent = create_agent(load_agent_config(Path("agent.toml")))
    result = agent.infer("digits-light", {"pixels": pixels}, label="personal")
    result.decision.action, result.where, result.outputs
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_core import __version__
from edge_core.lazy import lazy_exports

# name -> the module that defines it
_EXPORTS = {
    "Agent": "edge_agent.agent",
    "AgentResult": "edge_agent.agent",
    "AgentConfig": "edge_agent.config",
    "load_agent_config": "edge_agent.config",
    "create_agent": "edge_agent.assemble",
    "DeviceProfile": "edge_agent.profiles",
    "ProfileStore": "edge_agent.profiles",
    "detect_profile": "edge_agent.profiles",
    "resolve_profile": "edge_agent.profiles",
    "Action": "edge_agent.policy",
    "Decision": "edge_agent.policy",
    "EdgeError": "edge_core.errors",
    "ConfigError": "edge_core.errors",
    "InputError": "edge_core.errors",
    "ModelNotFoundError": "edge_core.errors",
    "PolicyRejected": "edge_core.errors",
    "PrivacyRefusal": "edge_core.errors",
    "OffloadError": "edge_core.errors",
    "DeadlineExceeded": "edge_core.errors",
}

__all__ = [
    "Action",
    "Agent",
    "AgentConfig",
    "AgentResult",
    "ConfigError",
    "DeadlineExceeded",
    "Decision",
    "DeviceProfile",
    "EdgeError",
    "InputError",
    "ModelNotFoundError",
    "OffloadError",
    "PolicyRejected",
    "PrivacyRefusal",
    "ProfileStore",
    "__version__",
    "create_agent",
    "detect_profile",
    "load_agent_config",
    "resolve_profile",
]

if TYPE_CHECKING:
    from edge_agent.agent import Agent, AgentResult
    from edge_agent.assemble import create_agent
    from edge_agent.config import AgentConfig, load_agent_config
    from edge_agent.policy import Action, Decision
    from edge_agent.profiles import DeviceProfile, ProfileStore, detect_profile, resolve_profile
    from edge_core.errors import (
        ConfigError,
        DeadlineExceeded,
        EdgeError,
        InputError,
        ModelNotFoundError,
        OffloadError,
        PolicyRejected,
        PrivacyRefusal,
    )


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
