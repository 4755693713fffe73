"""The in-memory state of one file's contents while it is open or not yet committed.

A file is a row of fixed-size *slots*; slot ``i`` covers bytes
``[i * chunk_size, (i + 1) * chunk_size)``. Each slot is, in order of precedence:
a dirty ``buffer`` being written, ``frozen`` bytes being compressed and stored, a stored
chunk (``ref``), or a hole of zeros. Data in a slot is never longer than the file's size
allows, and shorter data reads as zeros up to it.
"""

from __future__ import annotations

import trio

from nvfs.store import ChunkRef, LayoutTracker


class Slot:
    """One chunk-sized piece of a file."""

    __slots__ = ("buffer", "frozen", "ref", "version")

    def __init__(self, ref: ChunkRef | None = None) -> None:
        self.ref = ref
        self.buffer: bytearray | None = None
        self.frozen: bytearray | None = None  # a former buffer, never changed again
        self.version = 0  # bumped whenever an upload in flight becomes stale


class FileContent:
    """Slots, size and upload bookkeeping of one file."""

    def __init__(self, chunk_size: int, size: int, refs: list[ChunkRef | None],
                 layout: LayoutTracker) -> None:
        self.chunk_size = chunk_size
        self.layout = layout  # learns the tensor layout while the file is written from the start
        self.size = size
        self.slots = [Slot(ref) for ref in refs]
        self._extend_slots()
        self.dirty = False
        self.dirty_slots: dict[int, None] = {}  # slots with a buffer, oldest first
        self.error: BaseException | None = None
        self.orphaned = False  # chunks were stored that no manifest may name: collect garbage
        self._uploads = 0
        self._idle = trio.Event()
        self._idle.set()

    def _extend_slots(self) -> None:
        needed = -(-self.size // self.chunk_size)
        self.slots.extend(Slot() for _ in range(needed - len(self.slots)))

    def slot_length(self, index: int) -> int:
        """How many bytes of the file slot ``index`` covers at the current size."""
        return max(0, min(self.chunk_size, self.size - index * self.chunk_size))

    def pinned_ids(self) -> list[str]:
        """Chunk ids this content holds a pin on: one per slot that has a ref."""
        return [slot.ref.id for slot in self.slots if slot.ref is not None]

    def grow(self, size: int) -> None:
        if size > self.size:
            self.size = size
            self._extend_slots()

    def shrink(self, size: int) -> list[Slot]:
        """Cut the file to ``size`` (smaller than now); returns the slots dropped whole."""
        keep = -(-size // self.chunk_size)
        dropped = self.slots[keep:]
        del self.slots[keep:]
        for slot in dropped:
            slot.version += 1
        for index in [i for i in self.dirty_slots if i >= keep]:
            del self.dirty_slots[index]
        self.size = size
        return dropped

    def stored_estimate(self) -> int:
        """Stored bytes: stored chunks at their stored size, pending data at its logical size."""
        total = 0
        for slot in self.slots:
            if slot.buffer is not None:
                total += len(slot.buffer)
            elif slot.frozen is not None:
                total += len(slot.frozen)
            elif slot.ref is not None:
                total += slot.ref.stored
        return total

    def begin_upload(self) -> None:
        if self._uploads == 0:
            self._idle = trio.Event()
        self._uploads += 1

    def end_upload(self) -> None:
        self._uploads -= 1
        if self._uploads == 0:
            self._idle.set()

    async def wait_uploads(self) -> None:
        await self._idle.wait()
