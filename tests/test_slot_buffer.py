"""A slot's dirty buffer: writes anywhere below the chunk size, holes as zeros, room grown in place."""

import pytest

from nvfs.store import SharedChunkBuffers
from nvfs.vfs.content import SlotBuffer

pytestmark = pytest.mark.unit

CHUNK = 1 << 20


def test_small_writes_grow_it_and_a_gap_reads_as_zeros():
    buffer = SlotBuffer(CHUNK, b"", first_write_end=5)
    buffer.write(0, memoryview(b"hello"))
    buffer.write(10, memoryview(b"world"))  # past the end: 5 bytes of zeros between
    buffer.write(200_000, memoryview(b"!"))  # far past its room: grown, never beyond the chunk
    data = bytes(buffer.view())
    assert len(buffer) == 200_001 and data[:15] == b"hello\0\0\0\0\0world" and data[-1:] == b"!"
    assert data[15:200_000] == bytes(200_000 - 15)


def test_overwrite_truncate_and_views_of_existing_data():
    buffer = SlotBuffer(CHUNK, b"0123456789", first_write_end=4)
    buffer.write(2, memoryview(b"ab"))
    assert bytes(buffer.view()) == b"01ab456789"
    buffer.truncate(4)
    buffer.write(6, memoryview(b"z"))  # what the truncation cut off is gone: zeros
    assert bytes(buffer.view()) == b"01ab\0\0z"


def test_a_streaming_writer_fills_a_whole_chunk_in_place():
    buffer = SlotBuffer(CHUNK, b"", first_write_end=CHUNK // 4)
    pieces = [bytes([n]) * (CHUNK // 4) for n in range(4)]
    for n, piece in enumerate(pieces):
        buffer.write(n * len(piece), memoryview(piece))
    assert len(buffer) == CHUNK and bytes(buffer.view()) == b"".join(pieces)


def test_room_for_a_whole_chunk_comes_from_the_shared_buffers_however_it_began():
    """A slot that began with a small write (a record header) still ends in a shared buffer.

    Chunks outside the shared buffers are coded in the daemon, beside the FUSE thread: in a
    2 GiB torch.save 61 of 512 chunks began that way before this was so.
    """
    buffers = SharedChunkBuffers(2, CHUNK)

    def take(size: int):
        assert size == CHUNK
        return buffers.take()

    streaming = SlotBuffer(CHUNK, b"", first_write_end=CHUNK, whole_chunk=take)
    streaming.write(0, memoryview(b"s" * 10))
    assert buffers.offset_of(streaming.view()) is not None
    small = SlotBuffer(CHUNK, b"", first_write_end=60, whole_chunk=take)
    small.write(0, memoryview(b"h" * 60))
    assert buffers.offset_of(small.view()) is None  # a small file stays in a small array
    small.write(60, memoryview(b"x" * (CHUNK - 60)))
    assert buffers.offset_of(small.view()) is not None
    assert bytes(small.view()) == b"h" * 60 + b"x" * (CHUNK - 60)
    third = SlotBuffer(CHUNK, b"", first_write_end=CHUNK, whole_chunk=take)  # none left
    third.write(0, memoryview(b"y" * CHUNK))
    assert buffers.offset_of(third.view()) is None and bytes(third.view()) == b"y" * CHUNK
