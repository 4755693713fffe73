"""The superblock (``nvfs.json``): what makes a backend an nvfs store, and which format it has.

Read when a store is opened; written once, when an empty backend becomes a new store.
"""

from __future__ import annotations

import json
import logging
import time

from nvfs.backend import Backend, ObjectNotFound
from nvfs.store.errors import StoreError
from nvfs.store.keys import DIR_MARKER, dir_prefix
from nvfs.store.manifest import default_dir_manifest

log = logging.getLogger(__name__)

# 3: chunk objects one directory level deep; 2: named by BLAKE3, two levels deep; 1: named by
# SHA-256, two levels deep (all still read and written, each in its own layout)
STORE_FORMAT_VERSION = 3
NEW_STORE_HASH = "blake3"
SUPERBLOCK_KEY = "nvfs.json"
# Chunk (slot) size of files written by a mount without -o chunk_size. Larger chunks write
# faster (each costs Python work, a file or a request: a 2 GiB torch.save into a directory
# store took 3.10/3.24 s with 8 MiB, 3.46/3.55 s with 4 MiB, alternating), but a lazily read
# tensor then pulls in more around it, as the kernel reads around an mmap fault into the
# chunks on either side: safe_open of one 16 MiB tensor of a 1 GiB safetensors file from S3
# fetched 5.2% of the file's stored bytes with 8 MiB chunks, 3.9% with 4 MiB.
DEFAULT_CHUNK_SIZE = 4 << 20


def read_superblock(backend: Backend) -> dict:
    """The superblock of the store on ``backend``, made first if the backend is empty.

    Raises :class:`StoreError` where the backend holds something else, or a store of a
    format newer than this nvfs reads.
    """
    try:
        superblock = json.loads(backend.get(SUPERBLOCK_KEY))
    except ObjectNotFound:
        if not backend.is_empty():
            raise StoreError(
                f"{backend.describe()} is not empty and holds no nvfs store (no {SUPERBLOCK_KEY})"
            ) from None
        superblock = _initialise(backend)
    except ValueError as exc:
        raise StoreError(f"{backend.describe()}: {SUPERBLOCK_KEY} is unreadable: {exc}") from exc
    version = superblock.get("nvfs_store") if isinstance(superblock, dict) else None
    if not isinstance(version, int):
        raise StoreError(f"{backend.describe()}: {SUPERBLOCK_KEY} is not an nvfs superblock")
    if version > STORE_FORMAT_VERSION:
        raise StoreError(f"{backend.describe()}: store format {version} is newer than this nvfs")
    return superblock


def _initialise(backend: Backend) -> dict:
    """Make ``backend`` a new, empty store: its root directory, then the superblock."""
    now = time.time_ns()
    superblock = {
        "nvfs_store": STORE_FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "hash": NEW_STORE_HASH,
        "chunk_size": DEFAULT_CHUNK_SIZE,
    }
    root = default_dir_manifest(now)
    backend.put(dir_prefix(()) + DIR_MARKER, root.to_bytes(), durable=True)
    backend.put(SUPERBLOCK_KEY, json.dumps(superblock, indent=1).encode(), durable=True)
    log.info("initialised a new nvfs store in %s", backend.describe())
    return superblock
