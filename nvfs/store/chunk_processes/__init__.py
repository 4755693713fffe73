"""Chunk processes: child processes that fetch chunks (GET, decode, verify) or store them
(hash, code, write) for the daemon, outside its GIL.

:mod:`.pool` starts and tracks them, :mod:`.lanes` is the message protocol between the
daemon and a child, :mod:`.child` is the child's program, :mod:`.maps` maps fetched chunks
into the daemon.
"""

from nvfs.store.chunk_processes.lanes import ChunkProcessFailed, ChunkTarget
from nvfs.store.chunk_processes.maps import ChunkMaps
from nvfs.store.chunk_processes.pool import PUT_TIMEOUT, ChunkProcessPool, SentRequest

__all__ = ["PUT_TIMEOUT", "ChunkMaps", "ChunkProcessFailed", "ChunkProcessPool", "ChunkTarget", "SentRequest"]
