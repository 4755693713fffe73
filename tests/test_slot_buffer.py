"""A slot's dirty buffer: writes anywhere below the chunk size, holes as zeros, room grown in place."""

from nvfs.vfs.content import SlotBuffer

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
