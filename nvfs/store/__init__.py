"""Store layer: manifests, the chunk format, dedup, checksums and garbage collection."""

from nvfs.store.chunk import ChunkCorrupt
from nvfs.store.chunk_io import ChunkCall
from nvfs.store.chunk_processes import ChunkProcessPool
from nvfs.store.disk_cache import ChunkFileCache, DiskCacheError
from nvfs.store.errors import ChunkUnreadable, StoreError, StoreUnavailable
from nvfs.store.manifest import ChunkRef, Manifest, ManifestError
from nvfs.store.shared_buffers import SharedChunkBuffers
from nvfs.store.store import Store
from nvfs.store.superblock import DEFAULT_CHUNK_SIZE

__all__ = ["DEFAULT_CHUNK_SIZE", "ChunkCall", "ChunkCorrupt", "ChunkFileCache", "ChunkProcessPool",
           "ChunkRef", "ChunkUnreadable", "DiskCacheError", "Manifest", "ManifestError",
           "SharedChunkBuffers", "Store", "StoreError", "StoreUnavailable"]
