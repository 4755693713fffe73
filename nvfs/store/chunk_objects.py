"""Chunk objects as the store writes them, and the ids written lately (for dedup).

Shared by the daemon's store and the chunk processes that write chunks for it
(:mod:`nvfs.store.chunk_processes.child`): both write an object the same way.
"""

from __future__ import annotations

import time

from nvfs.backend import Backend
from nvfs.codec import Engine, Region
from nvfs.store.chunk import encode_chunk

KNOWN_LIMIT = 1 << 20  # chunk ids remembered as stored, for dedup without a backend round trip


def write_chunk_object(backend: Backend, engine: Engine, key: str, data: bytes | memoryview,
                       regions: list[Region] | None, digest: bytes) -> tuple[int, str]:
    """Code ``data`` (hashing to ``digest``), store it as chunk object ``key``; its stored size, encoding.

    The one place a chunk object is written, by the daemon or by a chunk process. On a
    shared backend an existing chunk may be collected by another mount any moment: it is
    stored again, which also renews its age.
    """
    parts, encoded = encode_chunk(data, engine, regions, digest)
    if backend.shared or not backend.exists(key):
        backend.put_parts(key, parts, durable=False)
    return sum(len(part) for part in parts), encoded.name


class KnownChunks:
    """Chunks this process stored lately, so that the same content is not coded again.

    Chunk id -> stored size, encoding, when it was stored. Emptied when it holds
    :data:`KNOWN_LIMIT` ids, rather than growing without bound.
    """

    def __init__(self) -> None:
        self._known: dict[str, tuple[int, str, float]] = {}

    def get(self, cid: str) -> tuple[int, str, float] | None:
        return self._known.get(cid)

    def remember(self, cid: str, stored: int, name: str) -> tuple[int, str, float]:
        if len(self._known) >= KNOWN_LIMIT:
            self._known.clear()
        known = self._known[cid] = (stored, name, time.time())
        return known

    def forget(self, cid: str) -> tuple[int, str, float] | None:
        return self._known.pop(cid, None)
