"""A byte-bounded LRU cache of decoded chunks, keyed by content address, and a thread to drop evicted ones."""

from __future__ import annotations

import queue
import threading
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


class ChunkDropper:
    """A thread that lets go of evicted chunks, so that the thread serving FUSE requests does not.

    A chunk a fetch process decoded is a memory map, and letting go of its last reference
    unmaps it, which takes the thread that does it about half a millisecond per chunk. Putting
    the chunks on a queue costs the FUSE thread a fraction of a microsecond, where handing
    each eviction to a trio worker thread would cost it a task and a result to take back.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[list[bytes] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="nvfs-chunk-dropper", daemon=True)
        self._thread.start()

    def drop(self, chunks: list[bytes]) -> None:
        """Let go of ``chunks`` (the list is emptied) in the dropper's thread."""
        self._queue.put(chunks)

    def stop(self) -> None:
        """Drop what is queued, then end the thread."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (chunks := self._queue.get()) is not None:
            chunks.clear()
