"""How the process's allocator gives large buffers back.

glibc's ``malloc`` serves a buffer under its *mmap threshold* from a heap arena, one a
thread up to eight a core, and raises that threshold to the size of any mapped buffer
once it is freed: after one large picture, buffers of its size come from the arenas,
and an arena gives memory back only from its top. A server whose requests run on
changing threads then keeps what its largest request took, arena by arena, none of it
in use ([Limits and timeouts](docs/limits.md) has the figures). A fixed threshold
keeps every large buffer in its own mapping, returned to the system when it is
freed, for a page fault a page when it is made. :func:`give_back_large_buffers` sets
it, once, at the start of each command; elsewhere than glibc it does nothing. What
smaller buffers leave free inside the arenas a server gives back with a
:class:`HeapTrimmer`.
"""

from __future__ import annotations

import ctypes
import functools
import os
import time
from collections.abc import Callable
from typing import Any

__all__ = ["LARGE_BUFFER", "HeapTrimmer", "give_back_large_buffers"]

LARGE_BUFFER = 256 * 1024  # a buffer from this size on has its own mapping
_M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)


@functools.cache
def give_back_large_buffers() -> bool:
    """Fix glibc's mmap threshold at :data:`LARGE_BUFFER`; whether it was set (``False``
    on a C library without ``mallopt``, such as musl's)."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, LARGE_BUFFER))


GROWTH_TO_TRIM = 16 * 1024 * 1024  # resident memory grown this much since the last trim
QUIET_TO_TRIM = 4 * 1024 * 1024  # above the lowest a trim left: worth a look when quiet
QUIET_TRIM_EVERY_S = 5.0  # such a look at most this often
TRIM_INTERVAL_S = 1.0  # how often a server calls HeapTrimmer.check


class HeapTrimmer:
    """Gives back the heap pages that freed buffers left, once the process has grown.

    A buffer under :data:`LARGE_BUFFER` comes from a heap arena: a request read in
    small pieces (an HTTP body in socket reads, a gRPC message in slices) leaves its
    pieces free in the middle of an arena when it ends, and the arena keeps them. A
    gateway sent one 60 MB request after another kept 50 MB more every few of them,
    none of it in use. :meth:`check` asks glibc's ``malloc_trim`` to give free pages
    back when resident memory has grown by ``growth`` bytes since the last trim left
    it; at the first check after that which finds it no longer growing; and, while it
    is not growing, every ``every_s`` seconds as long as it is ``quiet`` bytes above
    the lowest any trim left. Freed pages do not lower resident memory until a trim,
    so a trim in the middle of requests cannot tell what they still hold: the later
    ones give it back. A trim walks every arena (milliseconds), so it is not done
    after every request. Where ``/proc`` or ``malloc_trim`` are missing it does
    nothing."""

    def __init__(
        self,
        growth: int = GROWTH_TO_TRIM,
        quiet: int = QUIET_TO_TRIM,
        every_s: float = QUIET_TRIM_EVERY_S,
        *,
        statm: str = "/proc/self/statm",
        trim: Callable[[], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.growth, self.quiet, self.every_s = growth, quiet, every_s
        self.trims = 0
        self._statm = statm
        self._trim = trim if trim is not None else _malloc_trim()
        self._clock = clock
        self._mark = self._last = self._floor = self.resident()
        self._trimmed_at = clock()
        self._follow_up = False  # a trim while growing: one more once it stops

    def resident(self) -> int | None:
        """The process's resident memory in bytes (``None`` without ``/proc``)."""
        try:
            with open(self._statm, "rb") as statm:
                return int(statm.read().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            return None

    def check(self) -> bool:
        """Trim if the rule of the class says so; whether it did."""
        now, last = self.resident(), self._last
        self._last = now
        if self._trim is None or None in (now, last, self._mark, self._floor):
            return False
        assert now is not None and last is not None
        assert self._mark is not None and self._floor is not None
        if now >= self._mark + self.growth:
            self._follow_up = True
        elif now > last:  # growing, by less: wait
            return False
        elif self._follow_up:
            self._follow_up = False
        elif now < self._floor + self.quiet or self._clock() - self._trimmed_at < self.every_s:
            self._mark = min(self._mark, now)
            return False
        self._trim()
        self.trims += 1
        self._trimmed_at = self._clock()
        self._mark = self._last = self.resident()
        if self._mark is not None:
            self._floor = min(self._floor, self._mark)
        return True


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _libc_function(name: str) -> Any:
    """The C library's function ``name``, or ``None`` where it has none (the process's
    own symbols: no ``ldconfig`` or compiler needed to find the library)."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


def _malloc_trim() -> Callable[[], object] | None:
    trim = _libc_function("malloc_trim")
    if trim is None:
        return None
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    return lambda: trim(0)
