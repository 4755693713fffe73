"""A byte-bounded LRU cache of decoded chunks, keyed by content address."""

from __future__ import annotations

from collections import OrderedDict


class ChunkCache:
    """Decoded chunk bytes, least recently used evicted first once ``capacity`` is exceeded."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0

    def get(self, chunk_id: str) -> bytes | None:
        data = self._entries.get(chunk_id)
        if data is not None:
            self._entries.move_to_end(chunk_id)
        return data

    def __contains__(self, chunk_id: str) -> bool:
        return chunk_id in self._entries

    def put(self, chunk_id: str, data: bytes) -> list[bytes]:
        """Cache ``data``; returns the chunks evicted for it, for the caller to drop."""
        if len(data) > self.capacity or chunk_id in self._entries:
            return []
        self._entries[chunk_id] = data
        self._bytes += len(data)
        evicted = []
        while self._bytes > self.capacity:
            _, oldest = self._entries.popitem(last=False)
            self._bytes -= len(oldest)
            evicted.append(oldest)
        return evicted
