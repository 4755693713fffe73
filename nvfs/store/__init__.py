"""Store layer: manifests, the chunk format, dedup, checksums and garbage collection."""

from nvfs.codec import LayoutTracker
from nvfs.store.chunk import ChunkCorrupt
from nvfs.store.manifest import ChunkRef, Manifest, ManifestError
from nvfs.store.store import ChunkUnreadable, Store, StoreError, StoreUnavailable

__all__ = ["ChunkCorrupt", "ChunkRef", "ChunkUnreadable", "LayoutTracker", "Manifest", "ManifestError",
           "Store", "StoreError", "StoreUnavailable"]
