"""The read path: a file's bytes from its slots, decoded chunks from the cache or the store; read-ahead."""

from __future__ import annotations

import errno
import logging

import trio

from nvfs.store import ChunkCorrupt, ChunkRef, ChunkUnreadable
from nvfs.vfs.cache import ChunkCache, ChunkDropper
from nvfs.vfs.chunk_calls import ChunkCalls
from nvfs.vfs.config import VfsConfig
from nvfs.vfs.content import FileContent, Slot, SlotBuffer, SlotState
from nvfs.vfs.errors import VfsError
from nvfs.vfs.handles import Handle, OpenFiles
from nvfs.vfs.node import Node
from nvfs.vfs.workers import Workers

log = logging.getLogger(__name__)

# How far from where a sequential reader's newest request ended the next may start and still
# continue the run. With the kernel's read-ahead at 4 MiB its requests arrive out of order, up to
# 10 MiB behind the newest; taken for seeks, they would keep the window at 3 fetches.
STRAGGLER_DISTANCE = 16 << 20


class Reader:
    """Serves reads of open files; holds the decoded-chunk cache and the fetches under way."""

    def __init__(self, files: OpenFiles, chunks: ChunkCalls, workers: Workers, config: VfsConfig) -> None:
        self._files = files
        self._chunks = chunks
        self._workers = workers
        self._config = config
        self._cache = ChunkCache(config.cache_size)
        self._fetching: dict[str, trio.Event] = {}
        self._dropper: ChunkDropper | None = None

    def start(self) -> None:
        """Start the thread that lets go of evicted chunks."""
        self._dropper = ChunkDropper()

    async def stop(self) -> None:
        """Let go of the evicted chunks still queued, and end that thread."""
        if self._dropper is not None:
            await trio.to_thread.run_sync(self._dropper.stop)

    async def read(self, handle: Handle, offset: int, length: int) -> bytes | memoryview:
        """The file's bytes at ``offset``; zero-copy where one stored chunk holds them all.

        A view into a decoded chunk is safe to hand out: cached chunks are never changed,
        and the FUSE adapter copies the reply to the kernel before anything else runs.
        """
        node = handle.node
        content = self._files.ensure_content(node)
        end = min(offset + length, content.size)
        if offset >= end:
            return b""
        # Before waiting for this read's chunks: the kernel sends a sequential reader's
        # requests several at a time, and they finish in any order.
        self._read_ahead(handle, content, offset, end)
        chunk = content.chunk_size
        pieces: list[bytes | memoryview] = []
        position = offset
        while position < end:
            index, start = divmod(position, chunk)
            count = min(chunk - start, end - position)
            data = await self._slot_bytes(node, content, index)
            if isinstance(data, SlotBuffer):
                piece = memoryview(bytes(data.view()[start : start + count]))  # later writes change it
            else:
                piece = memoryview(data)[start : start + count]
            pieces.append(piece)
            if len(piece) < count:
                pieces.append(bytes(count - len(piece)))
            position += count
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def _slot_bytes(self, node: Node, content: FileContent, index: int
                          ) -> bytes | memoryview | SlotBuffer:
        slot = content.slots.get(index)
        state = slot.state if slot is not None else SlotState.HOLE
        if state is SlotState.DIRTY:
            return slot.buffer
        if state is SlotState.STORING:
            return slot.frozen
        if state is SlotState.STORED:
            return await self.chunk_bytes(node, index, slot)
        return b""

    async def chunk_bytes(self, node: Node, index: int, slot: Slot) -> bytes:
        """The decoded chunk of a stored slot; a chunk that cannot be read or verified is EIO."""
        ref = slot.ref
        assert ref is not None
        try:
            return await self._fetch(ref)
        except ChunkCorrupt as exc:
            log.error("%s: chunk %d (%s) failed verification: %s", node.display_path(), index, ref.id, exc)
            raise VfsError(errno.EIO) from None
        except (ChunkUnreadable, OSError) as exc:
            log.error("%s: chunk %d (%s) could not be read: %s", node.display_path(), index, ref.id, exc)
            raise VfsError(errno.EIO) from None

    async def _fetch(self, ref: ChunkRef) -> bytes:
        """Decoded chunk bytes from the cache, a fetch already under way, or the store."""
        while True:
            data = self._cache.get(ref.id)
            if data is not None:
                return data
            pending = self._fetching.get(ref.id)
            if pending is None:
                break
            await pending.wait()  # then look again: that fetch may have failed or been evicted
        done = self._fetching[ref.id] = trio.Event()
        try:
            data = await self._chunks.get_chunk(ref)
            evicted = self._cache.put(ref.id, data)
            if evicted:
                assert self._dropper is not None
                self._dropper.drop(evicted)
            return data
        finally:
            if self._fetching.get(ref.id) is done:
                del self._fetching[ref.id]
            done.set()

    def _read_ahead(self, handle: Handle, content: FileContent, offset: int, end: int) -> None:
        """Fetch the chunks after a sequential reader's position before it asks for them.

        The window is half of what the reader has asked for since its last seek, up to
        ``readahead`` bytes: a reader of one tensor (``safe_open``, an mmap) fetches little
        beyond the tensor. A run that began at the start of the file and has read a whole
        chunk is a copy or a restore (``cat``, ``cp``, ``torch.load``): its window is twice
        what it has read, so that it reaches ``readahead`` after 32 MiB rather than 128 and
        a cold restore waits for fewer chunks. A jump farther than ``STRAGGLER_DISTANCE``
        (or a chunk) starts over; a reader skipping a zip header stays sequential, and so do
        requests the kernel sends a little out of order. Called as a read arrives, not as it
        finishes: concurrent requests finish in any order, and judged by that order they
        would look like seeks.
        """
        chunk = content.chunk_size
        if abs(offset - handle.next_offset) <= max(chunk, STRAGGLER_DISTANCE):
            handle.streak += end - offset
            handle.next_offset = max(handle.next_offset, end)
        else:
            handle.streak, handle.ahead, handle.next_offset = end - offset, 0, end
            handle.run_start = offset
        from_start = handle.run_start == 0 and handle.streak >= chunk
        window = min(2 * handle.streak if from_start else handle.streak // 2, self._config.readahead) // chunk
        first = (end - 1) // chunk + 1
        last = min(first + window, content.slot_count())
        start, handle.ahead = max(first, handle.ahead), max(handle.ahead, last)
        for index in range(start, last):  # only chunks no earlier read of this run asked for
            slot = content.slots.get(index)
            ref = slot.ref if slot is not None else None
            if ref is not None and ref.id not in self._cache and ref.id not in self._fetching:
                self._workers.start_soon(self._prefetch, ref)

    async def _prefetch(self, ref: ChunkRef) -> None:
        try:
            await self._fetch(ref)
        except Exception as exc:  # read-ahead is a guess: the read itself reports failures
            log.debug("read-ahead of chunk %s failed: %s", ref.id, exc)
