"""The servers users would pick instead of the gateway, run for comparison: NVIDIA
Triton (through PyTriton) and MLServer, each on one of our model packages.

Neither is a dependency of the project. Each goes into a virtual environment of
its own, cached and made on first use (:mod:`benchmarks.peers.envs`), and runs
as child processes started here; ``python -m benchmarks peers`` measures them
beside the gateway (:mod:`benchmarks.peers.compare`), and the remote-backend tests
put MLServer behind a gateway. A peer that cannot be installed or started raises
:class:`PeerUnavailable`, which says why, so that a benchmark can skip it.
"""

from __future__ import annotations

from edge_core.errors import BackendUnavailableError

__all__ = ["PeerUnavailable"]


class PeerUnavailable(BackendUnavailableError):
    """A peer server cannot be installed or started here (the message says why)."""
