"""The store: namespace entries as manifests, file contents as content-addressed chunks.

Key layout (docs/FORMAT.md): ``nvfs.json`` (the superblock), ``chunks/ab/<hash>``
(one object per distinct chunk, shared by every file that holds those bytes) and
``tree/<path>`` (one manifest per file or symlink; ``tree/<dir>/#dir`` per directory).

:class:`Store` is the one object the rest of nvfs holds; each concern is a module of its
own: :mod:`.superblock`, :mod:`.keys`, :mod:`.namespace`, :mod:`.chunk_io` (with the
:mod:`.chunk_processes`) and :mod:`.garbage`. Every method blocks, except starting a chunk
call; the vfs layer calls them from worker threads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nvfs.backend import Backend
from nvfs.codec import Engine, Region
from nvfs.store.chunk import chunk_hash
from nvfs.store.chunk_io import ChunkIO, GetCall, PutCall
from nvfs.store.chunk_processes import ChunkProcessPool
from nvfs.store.disk_cache import ChunkFileCache
from nvfs.store.errors import StoreError
from nvfs.store.garbage import ChunkPins, GarbageCollector, SharedExclusiveLock, collection_grace
from nvfs.store.keys import CHUNK_PREFIX, Path, key_bytes
from nvfs.store.manifest import ChunkRef, Manifest
from nvfs.store.namespace import ListingReads, Namespace
from nvfs.store.shared_buffers import SharedChunkBuffers
from nvfs.store.superblock import DEFAULT_CHUNK_SIZE, SUPERBLOCK_KEY, read_superblock

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np


class Store:
    """Files, directories and symlinks of one nvfs store on one backend."""

    def __init__(self, backend: Backend, engine: Engine, superblock: dict,
                 gc_grace: float | None = None, disk_cache: ChunkFileCache | None = None,
                 fetch_pool: ChunkProcessPool | None = None, write_pool: ChunkProcessPool | None = None,
                 write_buffers: SharedChunkBuffers | None = None) -> None:
        self.backend = backend
        self.engine = engine
        self.superblock = superblock
        hash_name = superblock.get("hash", "sha256")
        try:
            digest_of = chunk_hash(hash_name)
        except KeyError as exc:
            raise StoreError(f"{backend.describe()}: {SUPERBLOCK_KEY}: {exc.args[0]}") from None
        grace = collection_grace(backend, gc_grace)
        self._pins = ChunkPins()
        gc_lock = SharedExclusiveLock()
        self._reads = ListingReads(backend)
        self.namespace = Namespace(backend, self._reads)
        version = int(superblock["nvfs_store"])
        self.chunks = ChunkIO(backend, engine, version, hash_name, digest_of, self._pins, gc_lock, grace,
                              disk_cache, fetch_pool, write_pool, write_buffers)
        self._collector = GarbageCollector(backend, self.namespace, self._pins, gc_lock, self.chunks.known,
                                           grace)

    @classmethod
    def open(cls, backend: Backend, engine: Engine, gc_grace: float | None = None,
             disk_cache: ChunkFileCache | None = None, fetch_pool: ChunkProcessPool | None = None,
             write_pool: ChunkProcessPool | None = None, write_buffers: SharedChunkBuffers | None = None
             ) -> Store:
        """Open the store on ``backend``, creating it if the backend is empty.

        ``fetch_pool`` serves reads where chunks come by signed GETs; ``write_pool`` stores
        chunks of a directory store coded by the CPU engine, from ``write_buffers``
        (:mod:`nvfs.store.chunk_io`). Each is left unused where it cannot serve.
        """
        superblock = read_superblock(backend)
        # Fetch processes decode on the CPU what comes by signed GETs, whatever the engine: the
        # GETs, not the decoding, are what the daemon's GIL holds back
        # (docs/decisions/fetch-processes.md). Not with a disk cache (objects are cached here).
        if fetch_pool is not None and (disk_cache is not None
                                       or backend.chunk_request(CHUNK_PREFIX + "probe") is None):
            fetch_pool = None
        store = cls(backend, engine, superblock, gc_grace, disk_cache, fetch_pool, write_pool,
                    write_buffers)  # refuses an unknown hash
        backend.discard_incomplete()
        for pool in store.process_pools():
            pool.start()
        return store

    def key_bytes(self, key: str) -> int:
        """Length of ``key`` as the backend stores it, its prefix included (S3 allows 1024 bytes)."""
        return key_bytes(self.backend.prefix, key)

    @property
    def chunk_size(self) -> int:
        return int(self.superblock.get("chunk_size", DEFAULT_CHUNK_SIZE))

    @property
    def fetch_pool(self) -> ChunkProcessPool | None:
        """The fetch processes, where reads use them."""
        return self.chunks.get_pool

    @property
    def write_pool(self) -> ChunkProcessPool | None:
        """The write processes, where writes use them."""
        return self.chunks.put_pool

    # ----- chunks -----------------------------------------------------------------

    def chunk_buffer(self, size: int) -> np.ndarray | None:
        """An uninitialised buffer of ``size`` bytes that a write process stores without a copy, if any."""
        return self.chunks.buffer(size)

    def release_idle_buffers(self) -> None:
        """Give the kernel the memory of the chunk buffers nobody is using (after writes stop)."""
        self.chunks.release_idle_buffers()

    def start_put(self, data: bytes | memoryview, regions: list[Region] | None = None) -> PutCall:
        """A call that stores ``data`` as a chunk and pins it (:class:`nvfs.store.chunk_io.ChunkCall`)."""
        return self.chunks.start_put(data, regions)

    def start_get(self, ref: ChunkRef) -> GetCall:
        """A call that fetches a chunk's verified bytes (:class:`nvfs.store.chunk_io.ChunkCall`)."""
        return self.chunks.start_get(ref)

    def pin(self, ids: Sequence[str]) -> None:
        self._pins.pin(ids)

    def unpin(self, ids: Sequence[str]) -> None:
        self._pins.unpin(ids)

    # ----- namespace ----------------------------------------------------------------

    def read_dir_meta(self, path: Path) -> Manifest:
        """Attributes of a directory; a prefix without a marker gets defaults."""
        return self.namespace.read_dir_meta(path)

    def list_dir(self, path: Path) -> dict[str, Manifest]:
        """Every entry of a directory with its manifest. Bad names and manifests are logged, skipped."""
        return self.namespace.list_dir(path)

    def write_entry(self, path: Path, manifest: Manifest) -> None:
        """Durably create or replace an entry; a file's chunks are made durable first."""
        self.namespace.write_entry(path, manifest)

    def delete_entry(self, path: Path, kind: str) -> None:
        self.namespace.delete_entry(path, kind)

    def rename_entry(self, old: Path, new: Path, kind: str) -> None:
        """Move an entry, replacing a file at ``new`` or an empty directory there."""
        self.namespace.rename_entry(old, new, kind)

    # ----- garbage collection and life cycle ----------------------------------------

    def collect_garbage(self) -> tuple[int, int]:
        """Delete chunks that no manifest names and nothing pins; returns (chunks, bytes)."""
        return self._collector.collect()

    def process_pools(self) -> list[ChunkProcessPool]:
        """The pools of fetch and write processes this store uses (none, one or both)."""
        return self.chunks.process_pools()

    def wait_for_processes(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds in all for the processes to be ready; whether they are."""
        return self.chunks.wait_for_processes(timeout)

    def close(self) -> None:
        for pool in self.process_pools():
            pool.close()
        self._reads.close()
        self.backend.close()
