"""The vfs's only calls that store or fetch a chunk: by a write or fetch process, else in a worker thread.

A process is asked over a socket while the calling task waits on the event loop; where no
process serves the store (or none is free now), a worker thread calls the store itself.
"""

from __future__ import annotations

import trio

from nvfs.store import ChunkRef, Store
from nvfs.vfs.content import FileContent
from nvfs.vfs.workers import Workers


class ChunkCalls:
    """Storing and fetching one chunk through the store, in the chunk workers' lane."""

    def __init__(self, store: Store, workers: Workers) -> None:
        self._store = store
        self._workers = workers

    async def put_chunk(self, content: FileContent, data: memoryview, regions) -> ChunkRef | None:
        """Store one chunk of ``content``; ``None``: not stored, since an earlier chunk of it failed."""

        def store_unless_failed():
            if content.error is not None:
                return None  # an earlier chunk of this version failed: it will not be committed
            return self._store.put_chunk(data, regions)

        ref = await self._put_by_write_process(data, regions) if content.error is None else None
        if ref is None:
            ref = await self._workers.run(store_unless_failed, lane=self._workers.chunk_lane)
        return ref

    async def _put_by_write_process(self, data: memoryview, regions) -> ChunkRef | None:
        """The chunk stored by a write process while this task waits on the event loop; ``None``: not now.

        A worker slot is held meanwhile, as a worker thread would hold one: then a lane of
        the write processes is free whenever a slot is.
        """
        if not self._store.writes_elsewhere():
            return None
        async with self._workers.chunk_lane:
            pending = self._store.begin_put(data, regions)
            if pending is None:
                return None
            with trio.CancelScope(shield=True):  # the process has the chunk: its answer must be read
                with trio.move_on_after(pending.timeout):
                    await trio.lowlevel.wait_readable(pending.fileno())
                    return self._store.finish_put(pending, answered=True)
                return self._store.finish_put(pending, answered=False)

    async def get_chunk(self, ref: ChunkRef) -> bytes | bytearray | memoryview:
        """The decoded, verified bytes of a stored chunk."""
        data = await self._get_by_fetch_process(ref)
        if data is None:
            data = await self._workers.run(self._store.get_chunk, ref, lane=self._workers.chunk_lane)
        return data

    async def _get_by_fetch_process(self, ref: ChunkRef) -> memoryview | None:
        """The chunk from a fetch process while this task waits on the event loop; ``None``: not now.

        A worker slot is held meanwhile, as a worker thread would hold one: ``threads`` bounds
        the fetches running at once either way, and a lane of the fetch processes is free
        whenever a slot is.
        """
        if not self._store.fetches_elsewhere():
            return None
        async with self._workers.chunk_lane:
            sent = self._store.begin_get(ref)
            if sent is None:
                return None
            with trio.CancelScope(shield=True):  # the memfd and the lane come back with the answer
                with trio.move_on_after(sent.timeout):
                    await trio.lowlevel.wait_readable(sent.fileno())
                    return self._store.finish_get(sent, ref, answered=True)
                return self._store.finish_get(sent, ref, answered=False)
