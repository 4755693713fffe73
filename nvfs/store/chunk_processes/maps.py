"""The daemon's side of a fetched chunk: the memfd a chunk process decoded it into, mapped."""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import resource
import threading
import weakref

from nvfs.store.chunk_processes.lanes import CHUNK_MAP_FLAGS

log = logging.getLogger(__name__)


class ChunkMaps:
    """Maps the chunks children leave in memfds, as many as the process can afford; copies the rest.

    A map needs no copy, but each costs a memory map (``vm.max_map_count``, 65530 by default)
    and, as CPython's mmap keeps a duplicate of the descriptor, an open file: a cache of 8 GiB
    in 4 MiB chunks would hold 2048 of them, past the usual soft limit of 1024, and the daemon
    could then open no socket. So the soft limit is raised to the hard one, and at most half of
    it, and of the map count, is used for chunks.
    """

    def __init__(self) -> None:
        self.limit = min(_raise_open_file_limit(), _max_map_count()) // 2
        self.mapped = 0
        self._lock = threading.Lock()

    def chunk_in(self, memfd: int, length: int) -> memoryview:
        """The ``length`` bytes a child left in ``memfd``: mapped, or read out into the heap."""
        if self._take():
            try:
                chunk = mmap.mmap(memfd, length, flags=CHUNK_MAP_FLAGS, prot=mmap.PROT_READ)
            except OSError as exc:
                self._give_back()
                log.debug("cannot map a fetched chunk (%s): copying it", exc)
            else:
                weakref.finalize(chunk, self._give_back)  # once the last view of it is gone
                return memoryview(chunk)
        data = bytearray(length)
        os.preadv(memfd, [data], 0)
        return memoryview(data)

    def _take(self) -> bool:
        with self._lock:
            if self.mapped >= self.limit:
                return False
            self.mapped += 1
            return True

    def _give_back(self) -> None:
        with self._lock:
            self.mapped -= 1


def _raise_open_file_limit() -> int:
    """Raise the soft limit on open files to the hard one; returns the soft limit then in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _max_map_count() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as knob:
            return int(knob.read())
    except (OSError, ValueError):
        return 65530  # the kernel's default
