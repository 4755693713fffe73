"""The in-memory state of one file's contents while it is open or not yet committed.

A file is a row of fixed-size *slots*; slot ``i`` covers bytes
``[i * chunk_size, (i + 1) * chunk_size)``. Each slot is in one :class:`SlotState`: a dirty
``buffer`` being written, ``frozen`` bytes being compressed and stored, a stored chunk
(``ref``), or a hole of zeros. Data in a slot is never longer than the file's size allows,
and shorter data reads as zeros up to it.

Slots are sparse: only those holding data exist, so a hole costs nothing until it is
written, whatever size a file claims (``truncate -s`` of a petabyte, a manifest declaring
one) -- memory follows the data written or read, not the logical size.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import numpy as np
import trio

from nvfs.formats import LayoutTracker
from nvfs.store import ChunkRef

_STREAMING_WRITE = 64 << 10  # a first write this large into a slot: make room for the whole chunk


class SlotBuffer:
    """A slot's dirty bytes, growing in place up to a chunk.

    A buffer grown write by write is reallocated and its earlier bytes copied again, each
    copy holding the GIL on the thread that serves every FUSE request. A streaming writer
    (a first write of ``_STREAMING_WRITE`` or more) gets room for the whole chunk up front
    instead, and the bytes are copied in by numpy, which releases the GIL while it copies.
    """

    __slots__ = ("_array", "_length", "_limit", "_whole_chunk")

    def __init__(self, limit: int, initial: bytes | bytearray | memoryview, first_write_end: int,
                 whole_chunk: Callable[[int], np.ndarray | None] = lambda size: None) -> None:
        """``whole_chunk(limit)``: where room for a whole chunk comes from, if not a new array."""
        self._limit = limit  # the chunk size: never longer
        self._length = len(initial)
        self._whole_chunk = whole_chunk
        room = limit if first_write_end >= _STREAMING_WRITE else max(self._length, first_write_end)
        self._array = self._room(room)
        self._array[: self._length] = np.frombuffer(initial, dtype=np.uint8)

    def _room(self, size: int) -> np.ndarray:
        whole = self._whole_chunk(size) if size == self._limit else None
        return whole if whole is not None else np.empty(size, dtype=np.uint8)

    def __len__(self) -> int:
        return self._length

    def write(self, start: int, data: memoryview) -> None:
        """Put ``data`` at ``start``; a gap after the current end reads as zeros."""
        end = start + len(data)
        if end > len(self._array):
            grown = self._room(min(self._limit, max(end, 2 * len(self._array))))
            grown[: self._length] = self._array[: self._length]
            self._array = grown
        if start > self._length:
            self._array[self._length : start] = 0
        self._array[start:end] = np.frombuffer(data, dtype=np.uint8)
        self._length = max(self._length, end)

    def truncate(self, length: int) -> None:
        self._length = min(self._length, length)

    def view(self) -> memoryview:
        """The bytes so far (valid until the next write or truncate)."""
        return memoryview(self._array)[: self._length]


class SlotState(enum.Enum):
    """What a slot holds. Written, it goes DIRTY -> STORING -> STORED; a write to it makes it DIRTY again."""

    DIRTY = "dirty"  # a SlotBuffer that writes still change
    STORING = "storing"  # a former buffer's bytes, frozen while they are coded and stored
    STORED = "stored"  # a chunk in the store (ref), read through the chunk cache
    HOLE = "hole"  # nothing: reads as zeros


class Slot:
    """One chunk-sized piece of a file: its fields say which :class:`SlotState` it is in."""

    __slots__ = ("buffer", "frozen", "ref", "version")

    def __init__(self, ref: ChunkRef | None = None) -> None:
        self.ref = ref
        self.buffer: SlotBuffer | None = None
        self.frozen: memoryview | None = None  # a former buffer's bytes, never changed again
        self.version = 0  # bumped whenever an upload in flight becomes stale

    @property
    def state(self) -> SlotState:
        """The state the fields give: the buffer, the frozen bytes and the ref, tested in that order."""
        if self.buffer is not None:
            return SlotState.DIRTY
        if self.frozen is not None:
            return SlotState.STORING
        if self.ref is not None:
            return SlotState.STORED
        return SlotState.HOLE


class FileContent:
    """Slots, size and upload bookkeeping of one file."""

    def __init__(self, chunk_size: int, size: int, refs: list[ChunkRef | None],
                 layout: LayoutTracker) -> None:
        self.chunk_size = chunk_size
        self.layout = layout  # learns the tensor layout while the file is written from the start
        self.size = size
        # Only slots that hold something; a missing index is a hole (refs past the size are ignored).
        self.slots: dict[int, Slot] = {
            index: Slot(ref) for index, ref in enumerate(refs[: self.slot_count()]) if ref is not None}
        self.dirty = False
        self.dirty_slots: dict[int, None] = {}  # slots with a buffer, oldest first
        self.error: BaseException | None = None
        self.orphaned = False  # chunks were stored that no manifest may name: collect garbage
        self._uploads = 0
        self._idle = trio.Event()
        self._idle.set()

    def slot_count(self) -> int:
        """How many slots the file's size spans, holes included."""
        return -(-self.size // self.chunk_size)

    def slot(self, index: int) -> Slot:
        """Slot ``index``, made (as a hole) if it does not exist yet: for a writer."""
        slot = self.slots.get(index)
        if slot is None:
            slot = self.slots[index] = Slot()
        return slot

    def slot_length(self, index: int) -> int:
        """How many bytes of the file slot ``index`` covers at the current size."""
        return max(0, min(self.chunk_size, self.size - index * self.chunk_size))

    def pinned_ids(self) -> list[str]:
        """Chunk ids this content holds a pin on: one per slot that has a ref."""
        return [slot.ref.id for slot in self.slots.values() if slot.ref is not None]

    def chunk_refs(self) -> list[ChunkRef | None]:
        """The manifest's chunk list: a ref or ``None`` (a hole) per slot, trailing holes left out.

        Readers treat chunks missing at the end as holes (docs/FORMAT.md), so a file grown by
        truncate costs its manifest nothing.
        """
        stored = [index for index, slot in self.slots.items() if slot.ref is not None]
        refs: list[ChunkRef | None] = [None] * (max(stored) + 1 if stored else 0)
        for index in stored:
            refs[index] = self.slots[index].ref
        return refs

    def grow(self, size: int) -> None:
        self.size = max(self.size, size)

    def shrink(self, size: int) -> list[Slot]:
        """Cut the file to ``size`` (smaller than now); returns the slots dropped whole."""
        keep = -(-size // self.chunk_size)
        dropped = [self.slots.pop(index) for index in [i for i in self.slots if i >= keep]]
        for slot in dropped:
            slot.version += 1
        for index in [i for i in self.dirty_slots if i >= keep]:
            del self.dirty_slots[index]
        self.size = size
        return dropped

    def stored_estimate(self) -> int:
        """Stored bytes: stored chunks at their stored size, pending data at its logical size."""
        total = 0  # the fields tested in SlotState's order, without a property call per slot
        for slot in self.slots.values():
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
