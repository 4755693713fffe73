"""glibc malloc tuning for processes that handle chunk-sized buffers (the daemon, fetch processes)."""

from __future__ import annotations

import ctypes
import functools

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # mallopt(3) parameters


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library, if it is glibc (the only one with these knobs)."""
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def tune_heap(mmap_threshold: int, keep_free: int, arenas: int) -> bool:
    """Serve allocations below ``mmap_threshold`` from heaps that keep ``keep_free`` bytes free.

    ``arenas`` caps the number of heaps (each keeps its own free memory). Returns False where
    the C library is not glibc, which then keeps its defaults.
    """
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
    libc.mallopt(_M_TRIM_THRESHOLD, keep_free)
    libc.mallopt(_M_ARENA_MAX, arenas)
    return True


def release_free_heap() -> None:
    """Give the kernel every free page of every heap, ``keep_free`` or not (glibc's malloc_trim).

    Free memory in the middle of a heap stays otherwise, however much: after a burst of writes
    the daemon kept 275 MiB it no longer used.
    """
    libc = _glibc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
