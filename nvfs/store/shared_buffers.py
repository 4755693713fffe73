"""Chunk buffers in memory that the daemon shares with its write processes.

A whole-chunk write buffer taken from here is a piece of one memfd that the write processes
(:mod:`nvfs.store.chunk_processes`) have mapped too: the FUSE thread copies the writer's bytes into
it once, and a write process hashes, codes and stores the chunk from the same pages. Nothing
is copied to hand it over and no worker thread of the daemon runs Python beside the FUSE
thread (see :mod:`nvfs.store.chunk_io` for why that matters).

A buffer goes back to the free list when the last reference to it is dropped (the file's chunk was
stored, overwritten, truncated or its file let go), whoever held it: no caller has to give
it back, and one that keeps a view keeps the bytes valid.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref

import numpy as np


class SharedChunkBuffers:
    """``count`` buffers of ``size`` bytes in one memfd; its pages are allocated on first use."""

    def __init__(self, count: int, size: int) -> None:
        self.size = size
        self.count = count
        self.fd = os.memfd_create("nvfs-chunk-buffers", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, count * size)
            self._map = mmap.mmap(self.fd, count * size)
        except OSError:
            os.close(self.fd)
            raise
        self._array = np.frombuffer(self._map, dtype=np.uint8)
        self._start = self._array.ctypes.data
        self._free = list(range(count - 1, -1, -1))
        self._lock = threading.Lock()

    def take(self) -> np.ndarray | None:
        """A free buffer of ``size`` bytes (uninitialised), or ``None`` when all are in use."""
        with self._lock:
            if not self._free:
                return None
            index = self._free.pop()
        buffer = self._array[index * self.size : (index + 1) * self.size]
        weakref.finalize(buffer, self._give_back, index)
        return buffer

    def _give_back(self, index: int) -> None:
        with self._lock:
            self._free.append(index)

    def offset_of(self, data: memoryview) -> int | None:
        """Where ``data`` starts in the memfd, if it lies wholly inside one of its buffers."""
        view = np.frombuffer(data, dtype=np.uint8)
        offset = view.ctypes.data - self._start if len(view) else -1
        if offset < 0 or offset + len(view) > self.count * self.size:
            return None
        return offset if offset // self.size == (offset + len(view) - 1) // self.size else None

    def in_use(self) -> int:
        with self._lock:
            return self.count - len(self._free)

    def release_free_pages(self) -> None:
        """Give the kernel the pages of every free buffer (after a burst of writes).

        Under the lock: a buffer taken meanwhile must not lose the bytes written into it.
        """
        with self._lock:
            for index in self._free:
                self._map.madvise(mmap.MADV_REMOVE, index * self.size, self.size)
