"""Store layer: manifests, the chunk format, dedup, checksums and garbage collection."""

from nvfs.store.chunk import ChunkCorrupt
from nvfs.store.disk_cache import ChunkFileCache, DiskCacheError
from nvfs.store.fetch_pool import FetchPool
from nvfs.store.manifest import ChunkRef, Manifest, ManifestError
from nvfs.store.slots import SharedSlots
from nvfs.store.store import DEFAULT_CHUNK_SIZE, ChunkUnreadable, Store, StoreError, StoreUnavailable

__all__ = ["DEFAULT_CHUNK_SIZE", "ChunkCorrupt", "ChunkFileCache", "ChunkRef", "ChunkUnreadable",
           "DiskCacheError", "FetchPool", "Manifest", "ManifestError", "SharedSlots",
           "Store", "StoreError", "StoreUnavailable"]
