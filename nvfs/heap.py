"""glibc malloc tuning for processes that handle chunk-sized buffers (the daemon, fetch processes)."""

from __future__ import annotations

import ctypes

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # mallopt(3) parameters


def tune_heap(mmap_threshold: int, keep_free: int, arenas: int) -> bool:
    """Serve allocations below ``mmap_threshold`` from heaps that keep ``keep_free`` bytes free.

    ``arenas`` caps the number of heaps (each keeps its own free memory). Returns False where
    the C library is not glibc, which then keeps its defaults.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
        libc.mallopt(_M_TRIM_THRESHOLD, keep_free)
        libc.mallopt(_M_ARENA_MAX, arenas)
    except (OSError, AttributeError):
        return False
    return True
