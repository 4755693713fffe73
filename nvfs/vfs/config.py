"""The tunables of a mount: the ``-o`` options that reach the vfs."""

from __future__ import annotations

import os
from dataclasses import dataclass

from nvfs.store import DEFAULT_CHUNK_SIZE


@dataclass
class VfsConfig:
    """Tunables of a mount (``-o`` options)."""

    chunk_size: int = DEFAULT_CHUNK_SIZE
    cache_size: int = 256 << 20
    max_inflight: int = 256 << 20
    max_dirty: int = 256 << 20
    readahead: int = 64 << 20
    threads: int = max(4, os.cpu_count() or 1)
    # Seconds a directory listing is trusted before the store is listed again, so that
    # files other mounts commit show up; None where this mount is the store's only user.
    metadata_ttl: float | None = None
    # close(2) returns before the data written is stored (it then reports only failures
    # already known); the commit at the last release runs in the background, and fsync and
    # unmount still wait for it.
    async_close: bool = False
    # Largest size a file may be given (write or truncate past it: EFBIG). Holes cost no
    # memory, but a manifest lists one entry per chunk up to its last stored chunk.
    max_file_size: int = 16 << 40
