"""The write path: bytes into slot buffers, full slots stored in the background, truncation.

A full slot is frozen and stored while the writer goes on; the writer waits only when
``max_inflight`` bytes are already on their way, or when more than ``max_dirty`` bytes of
its file sit in buffers not yet submitted.
"""

from __future__ import annotations

import errno
import logging
import time

import trio

from nvfs.formats import LayoutTracker
from nvfs.store import ChunkRef, Store
from nvfs.vfs.chunk_calls import ChunkCalls
from nvfs.vfs.config import VfsConfig
from nvfs.vfs.content import FileContent, Slot, SlotBuffer, SlotState
from nvfs.vfs.errors import VfsError, store_errno
from nvfs.vfs.garbage import GarbageCollector
from nvfs.vfs.handles import Handle, OpenFiles
from nvfs.vfs.node import Node
from nvfs.vfs.reader import Reader
from nvfs.vfs.workers import Workers

log = logging.getLogger(__name__)


class Writer:
    """Writes and truncates open files, and keeps count of the chunk uploads of every file."""

    def __init__(self, store: Store, files: OpenFiles, reader: Reader, chunks: ChunkCalls,
                 garbage: GarbageCollector, workers: Workers, config: VfsConfig) -> None:
        self._store = store
        self._files = files
        self._reader = reader  # a partly rewritten slot starts from its stored chunk
        self._chunks = chunks
        self._garbage = garbage
        self._workers = workers
        self._config = config
        self._inflight = trio.Semaphore(max(1, config.max_inflight // config.chunk_size))
        self._uploads = 0  # chunk uploads running, of every file, released ones included
        self._uploads_started = 0
        self._uploads_idle = trio.Event()
        self._uploads_idle.set()
        self._drained = trio.Event()  # set, and replaced, each time the last upload in flight ends

    async def uploads_drained(self) -> None:
        """Return the next time the last chunk upload in flight finishes: a burst of writes drained."""
        await self._drained.wait()

    def upload_count(self) -> int:
        """Chunk uploads started since the mount: it changes while anything is written."""
        return self._uploads_started

    async def wait_uploads(self) -> None:
        """Return once no chunk upload of any file is running."""
        await self._uploads_idle.wait()

    async def write(self, handle: Handle, offset: int, data: bytes) -> int:
        if not handle.writable:
            raise VfsError(errno.EBADF)
        node = handle.node
        async with node.lock:
            content = self._files.ensure_content(node)
            if content.error is not None:
                raise VfsError(store_errno(content.error), f"an earlier write failed: {content.error}")
            if offset + len(data) > self._config.max_file_size:
                raise VfsError(errno.EFBIG, f"a write to {offset + len(data)} bytes is past max_file_size")
            await self._write_locked(node, content, offset, memoryview(data))
            if handle.sets_mtime:
                node.mtime_ns = node.ctime_ns = time.time_ns()
        return len(data)

    async def _write_locked(self, node: Node, content: FileContent, offset: int, data: memoryview) -> None:
        size = content.chunk_size
        content.grow(offset + len(data))
        content.dirty = True
        done = 0
        while done < len(data):
            position = offset + done
            index, start = divmod(position, size)
            count = min(size - start, len(data) - done)
            buffer = await self._writable_buffer(node, content, index, start, count)
            buffer.write(start, data[done : done + count])
            if start + count == size:
                await self.submit(node, index)
            done += count
        while len(content.dirty_slots) * size > self._config.max_dirty:
            await self.submit(node, next(iter(content.dirty_slots)))

    async def _writable_buffer(self, node: Node, content: FileContent, index: int, start: int,
                               count: int) -> SlotBuffer:
        """The dirty buffer of a slot, made from its current data if it has none yet."""
        slot = content.slot(index)
        state = slot.state
        if state is SlotState.DIRTY:
            return slot.buffer
        if state is SlotState.STORING:
            base: bytes | memoryview = slot.frozen
        elif state is SlotState.STORED and not (start == 0 and count >= slot.ref.length):
            base = await self._reader.chunk_bytes(node, index, slot)
        else:
            base = b""  # a hole, or a stored chunk this write covers whole
        self._replace_ref(content, slot, None)
        slot.buffer = SlotBuffer(content.chunk_size, base[: content.slot_length(index)], start + count,
                                 self._store.chunk_buffer)
        slot.frozen = None
        slot.version += 1
        content.dirty_slots[index] = None
        return slot.buffer

    def _replace_ref(self, content: FileContent, slot: Slot, ref: ChunkRef | None) -> None:
        if slot.ref is not None:
            self._store.unpin([slot.ref.id])
            content.orphaned = True
        slot.ref = ref

    async def submit(self, node: Node, index: int) -> None:
        """Freeze a dirty slot and store it in the background (waits if too much is in flight)."""
        content = node.content
        assert content is not None
        slot = content.slots.get(index)
        if slot is None or slot.state is not SlotState.DIRTY:
            return
        data = slot.buffer.view()  # frozen from here on: a later write to the slot starts a new buffer
        slot.buffer, slot.frozen = None, data
        slot.version += 1
        content.dirty_slots.pop(index, None)
        regions = content.layout.chunk_regions(index * content.chunk_size, data)
        await self._acquire_inflight(content)
        content.begin_upload()
        if self._uploads == 0:
            self._uploads_idle = trio.Event()
        self._uploads += 1
        self._uploads_started += 1
        self._workers.start_soon(self._upload, node, content, index, slot, slot.version, data, regions)

    async def _acquire_inflight(self, content: FileContent) -> None:
        """Wait for room among the bytes in flight, but give up once this file's data failed.

        A failing store can hold every slot for a minute of retries; the writer should hear
        about the failure, not wait behind it.
        """
        while True:
            if content.error is not None:
                raise VfsError(store_errno(content.error), f"storing data failed: {content.error}")
            with trio.move_on_after(0.5):
                await self._inflight.acquire()
                return

    async def _upload(self, node: Node, content: FileContent, index: int, slot: Slot, version: int,
                      data: memoryview, regions) -> None:
        """Store a frozen slot; the slot takes the chunk unless it changed meanwhile."""
        try:
            ref = await self._chunks.put_chunk(content, data, regions)
            if ref is None:
                return
        except Exception as exc:  # surfaces as EIO on the next write, fsync or close
            log.error("%s: storing chunk %d failed: %s", node.display_path(), index, exc)
            content.error = exc
        else:
            if slot.version == version:
                self._replace_ref(content, slot, ref)
                slot.frozen = None
            else:
                self._store.unpin([ref.id])  # overwritten or truncated while it was stored
                content.orphaned = True
                if node.content is not content:
                    self._garbage.request()  # the file let go of this content before the chunk landed
        finally:
            self._inflight.release()
            content.end_upload()
            self._uploads -= 1
            if self._uploads == 0:
                self._uploads_idle.set()
                self._drained.set()
                self._drained = trio.Event()

    def check_size(self, node: Node, size: int) -> None:
        """Refuse a negative size, and growing a file past ``max_file_size`` (EFBIG)."""
        if size < 0:
            raise VfsError(errno.EINVAL)
        if size > max(self._config.max_file_size, node.size()):
            raise VfsError(errno.EFBIG, f"{size} bytes is more than max_file_size")

    async def truncate(self, node: Node, size: int) -> None:
        """Give the file ``size`` bytes: grow it with a hole, or drop what lies past ``size``."""
        self.check_size(node, size)
        content = self._files.ensure_content(node)
        content.dirty = True
        if size == 0:
            content.layout = LayoutTracker()  # rewritten from scratch: learn anew
        if size >= content.size:
            content.grow(size)
            return
        for dropped in content.shrink(size):
            self._replace_ref(content, dropped, None)
        index, keep = divmod(size, content.chunk_size)
        if keep and index in content.slots:
            buffer = await self._writable_buffer(node, content, index, 0, 0)
            buffer.truncate(keep)
