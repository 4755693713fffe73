"""The vfs's only calls that store or fetch a chunk: by a chunk process, else in a worker thread.

A chunk process is asked over a socket while the calling task waits on the event loop; where
no process serves the store (or none is free now, or one failed), a worker thread does the
work through the store itself (:meth:`nvfs.store.ChunkCall.finish`).
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from nvfs.store import ChunkCall, ChunkRef, Store
from nvfs.vfs.content import FileContent
from nvfs.vfs.workers import Workers


class ChunkCalls:
    """Storing and fetching one chunk through the store, in the chunk workers' lane."""

    def __init__(self, store: Store, workers: Workers) -> None:
        self._store = store
        self._workers = workers

    async def put_chunk(self, content: FileContent, data: memoryview, regions) -> ChunkRef | None:
        """Store one chunk of ``content``; ``None``: not stored, since an earlier chunk of it failed
        (that version will not be committed)."""
        return await self._complete(self._store.start_put(data, regions), lambda: content.error is None)

    async def get_chunk(self, ref: ChunkRef) -> bytes | bytearray | memoryview:
        """The decoded, verified bytes of a stored chunk."""
        return await self._complete(self._store.start_get(ref))

    async def _complete(self, call: ChunkCall, wanted: Callable[[], bool] = lambda: True):
        """The result of a chunk call: from a chunk process, or from a worker thread.

        While a chunk process has the call, this task waits for it on the event loop and holds
        a slot of the chunk lane, as a worker thread would hold one, so that a lane of the
        chunk processes is free whenever a slot is. ``wanted`` is asked before the work starts,
        either way: ``None`` where it says no.
        """
        lane = self._workers.chunk_lane
        if call.may_send and wanted():
            async with lane:
                if call.send():
                    with trio.CancelScope(shield=True):  # the process has the chunk: its answer must be read
                        with trio.move_on_after(call.timeout) as waiting:
                            await trio.lowlevel.wait_readable(call.fileno())
                        result = call.receive(answered=not waiting.cancelled_caught)
                    if result is not None:
                        return result

        def chunk_call_here():
            return call.finish() if wanted() else None

        return await self._workers.run(chunk_call_here, lane=lane)
