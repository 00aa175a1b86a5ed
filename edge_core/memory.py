"""How the process's allocator gives large buffers back.

glibc's ``malloc`` serves a buffer under its *mmap threshold* from a heap arena, one a
thread up to eight a core, and raises that threshold to the size of any mapped buffer
once it is freed: after one large picture, buffers of its size come from the arenas,
and an arena gives memory back only from its top. A server whose requests run on
changing threads then keeps what its largest request took, arena by arena, none of it
in use ([Limits and timeouts](docs/limits.md) has the figures). A fixed threshold
keeps every large buffer in its own mapping, returned to the system when it is
freed, for a page fault a page when it is made. :func:`give_back_large_buffers` sets
it, once, at the start of each command; elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["LARGE_BUFFER", "give_back_large_buffers"]

LARGE_BUFFER = 256 * 1024  # a buffer from this size on has its own mapping
_M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)


@functools.cache
def give_back_large_buffers() -> bool:
    """Fix glibc's mmap threshold at :data:`LARGE_BUFFER`; whether it was set (``False``
    on a C library without ``mallopt``, such as musl's)."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        return False
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, LARGE_BUFFER))
