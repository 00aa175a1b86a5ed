"""The event loop the gateway runs on: uvloop where it is installed, else asyncio's.

The gRPC front end (grpc.aio) hands every call's events to the loop through
callbacks, and the REST front end's protocol runs on the loop's transports: the
loop's own cost is paid several times a request. uvloop (libuv, in C) pays it for
less: measured on 2 cores with the wide MLP and 64 stock gRPC clients, alternating
gateways in six pairs, 1,421-2,097 against 1,214-1,829 requests/s (five pairs of six
ahead). uvloop is for Linux and macOS; elsewhere, or with ``--loop asyncio`` (say, to
rule the loop out while debugging), the standard loop serves the same. The offload
benchmark's bare gRPC echo (``benchmarks.agent.grpc_echo``) runs on the same loop, so
that its floor is built as the gateway is.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LOOPS", "loop_kind", "loop_name", "new_event_loop", "run"]

LOOPS = ("auto", "uvloop", "asyncio")

T = TypeVar("T")


def loop_name(kind: str = "auto") -> str:
    """The loop ``kind`` stands for: ``uvloop`` or ``asyncio``.

    Raises:
        ValueError: an unknown kind, or ``uvloop`` where it is not installed.
    """
    if kind not in LOOPS:
        raise ValueError(f"unknown event loop {kind!r}: choose from {', '.join(LOOPS)}")
    if kind == "asyncio":
        return kind
    installed = importlib.util.find_spec("uvloop") is not None
    if kind == "uvloop" and not installed:
        raise ValueError("event loop 'uvloop' asked for, but uvloop is not installed")
    return "uvloop" if installed else "asyncio"


def loop_kind(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: what ``loop`` is (for the start-up log)."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def new_event_loop(kind: str = "auto") -> asyncio.AbstractEventLoop:
    """A new loop of ``kind`` (see :func:`loop_name`)."""
    if loop_name(kind) == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T], kind: str = "auto") -> T:
    """``asyncio.run(main)`` on a loop of ``kind`` (see :func:`loop_name`)."""
    if loop_name(kind) == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
