"""Store layer: manifests, the chunk format, dedup, checksums and garbage collection."""

from nvfs.codec import LayoutTracker
from nvfs.store.chunk import ChunkCorrupt
from nvfs.store.disk_cache import ChunkFileCache, DiskCacheError
from nvfs.store.manifest import ChunkRef, Manifest, ManifestError
from nvfs.store.store import ChunkUnreadable, Store, StoreError, StoreUnavailable

__all__ = ["ChunkCorrupt", "ChunkFileCache", "ChunkRef", "ChunkUnreadable", "DiskCacheError", "LayoutTracker",
           "Manifest", "ManifestError", "Store", "StoreError", "StoreUnavailable"]
