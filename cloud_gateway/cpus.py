"""Which CPU cores run inference, and which run everything else.

With ``inference_cpus`` set, the gateway keeps its model runs and its front
ends apart, as Triton's host policies (``cpu-cores``) do: the inference
threads, and the threads ONNX Runtime starts for a session, run only on those
cores; the event loop, gRPC's and uvicorn's threads only on the others. The
front ends then answer and parse while a batch runs, instead of taking turns
with it on every core, and a burst of requests cannot slow a running batch.

Linux only (``os.sched_setaffinity``): there, a thread's affinity is its own
and the threads it starts inherit it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterator

from edge_core.errors import ConfigError

__all__ = ["available", "check", "others", "pin", "pinned"]


def available() -> frozenset[int]:
    """The cores this process may run on."""
    if not hasattr(os, "sched_getaffinity"):
        return frozenset(range(os.cpu_count() or 1))
    return frozenset(os.sched_getaffinity(0))


def check(cpus: Collection[int]) -> frozenset[int]:
    """``cpus`` as a set, if inference can be pinned to them and some core is left.

    Raises:
        ConfigError: not Linux, an unknown core, or no core left for the front ends.
    """
    if not hasattr(os, "sched_setaffinity"):
        raise ConfigError("inference_cpus needs Linux (sched_setaffinity)")
    wanted = frozenset(cpus)
    cores = available()
    unknown = sorted(wanted - cores)
    if not wanted or unknown:
        raise ConfigError(
            f"inference_cpus {sorted(wanted)}: expected a non-empty list of this "
            f"machine's cores {sorted(cores)}" + (f", not {unknown}" if unknown else "")
        )
    if not cores - wanted:
        raise ConfigError(
            f"inference_cpus {sorted(wanted)} takes every core: leave at least one "
            "for the front ends"
        )
    return wanted


def others(cpus: Collection[int]) -> frozenset[int]:
    """The cores that are not ``cpus``: the front ends' share."""
    return available() - frozenset(cpus)


def pin(cpus: Collection[int]) -> None:
    """Run the calling thread (and the threads it starts from now on) on ``cpus`` only."""
    os.sched_setaffinity(0, set(cpus))


@contextlib.contextmanager
def pinned(cpus: Collection[int] | None) -> Iterator[None]:
    """Run the calling thread on ``cpus`` for the block (``None``: leave it as it is);
    threads started inside, e.g. a new session's pool, keep ``cpus``."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    pin(cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
