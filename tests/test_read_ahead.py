"""Read-ahead of a sequential reader whose requests come and finish out of order (nvfs/vfs/reader.py).

The kernel sends a sequential reader's requests several at a time; they finish in whatever
order their chunks arrive. Judged by the order they finish in, a reader looked as if it
seeked every few MiB, and its read-ahead window never grew. With a wider kernel read-ahead
they also *arrive* out of order: a request up to 10 MiB behind the newest one (traced with a
4 MiB window), which, taken for a seek, kept the window at a few chunks. Here a real store on
a directory gets such patterns straight from trio, whose scheduler runs woken tasks in either
order on purpose, so the requests of a batch finish in both orders.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref

import pytest
import trio
import trio.testing

from nvfs.backend.directory import DirectoryBackend
from nvfs.codec.cpu import CpuEngine
from nvfs.store import Store
from nvfs.vfs import ROOT_INO, Node, Vfs, VfsConfig

pytestmark = pytest.mark.unit

CHUNK = 1 << 20
REQUEST = CHUNK  # one chunk each, as the kernel sends a 1 MiB read-ahead window
SIZE = 48 * CHUNK
READAHEAD = 16 * CHUNK
CONFIG = VfsConfig(chunk_size=CHUNK, cache_size=64 * CHUNK, readahead=READAHEAD, threads=4)


async def stored_file(vfs: Vfs, data: bytes) -> Node:
    """Write ``data`` as the committed file ``ckpt``."""
    fh, node = await vfs.create(ROOT_INO, "ckpt", 0o644, 0, 0)
    await vfs.write(fh, 0, data)
    await vfs.flush(fh)
    await vfs.release(fh)
    return node


# Positions (in requests) in the order the kernel sends them, per batch of 8.
IN_ORDER = list(range(8))
STRAGGLERS = [0, 1, 4, 5, 6, 7, 2, 3]  # 2 and 3 come after 7: 6 MiB behind the newest


@pytest.mark.parametrize("arrival", [IN_ORDER, STRAGGLERS], ids=["in-order", "stragglers"])
def test_requests_out_of_order_keep_a_sequential_reader_sequential(tmp_path, arrival):
    data = os.urandom(SIZE)

    async def scenario() -> None:
        vfs = Vfs(Store.open(DirectoryBackend(str(tmp_path)), CpuEngine()), CONFIG)
        async with trio.open_nursery() as nursery:
            vfs.start(nursery)
            await stored_file(vfs, data)
            reader = Vfs(vfs.store, CONFIG)  # a fresh cache: every chunk comes from the store
            reader.start(nursery)
            ino = (await reader.lookup(ROOT_INO, "ckpt")).ino
            fh = await reader.open(ino, os.O_RDONLY)
            got = bytearray(SIZE)

            async def read(offset: int) -> None:
                got[offset : offset + REQUEST] = await reader.read(fh, offset, REQUEST)

            for batch in range(0, SIZE, len(arrival) * REQUEST):
                async with trio.open_nursery() as requests:
                    for position in arrival:
                        requests.start_soon(read, batch + position * REQUEST)
                        await trio.testing.wait_all_tasks_blocked()  # it has arrived: send the next
            handle = reader.handle(fh)
            assert handle.streak == SIZE, "a request finishing early or arriving late was taken for a seek"
            assert handle.ahead == SIZE // CHUNK  # the window grew to the end of the file
            assert bytes(got) == data
            await reader.release(fh)
            nursery.cancel_scope.cancel()

    trio.run(scenario)


def test_a_run_from_the_start_of_the_file_reads_ahead_farther(tmp_path):
    """A copy or restore (a run from offset 0) gets twice its streak; a run after a seek half of it."""

    async def scenario() -> None:
        vfs = Vfs(Store.open(DirectoryBackend(str(tmp_path)), CpuEngine()), CONFIG)
        async with trio.open_nursery() as nursery:
            vfs.start(nursery)
            node = await stored_file(vfs, os.urandom(SIZE))
            fh = await vfs.open(node.ino, os.O_RDONLY)
            handle = vfs.handle(fh)
            await vfs.read(fh, 0, CHUNK // 2)  # a header: less than a chunk read, no run yet
            assert handle.ahead == 1
            for offset in range(CHUNK // 2, 4 * CHUNK, REQUEST // 2):
                await vfs.read(fh, offset, REQUEST // 2)
            assert handle.ahead == 4 + 2 * 4  # the next chunk, then twice the 4 chunks read
            for offset in range(4 * CHUNK, 12 * CHUNK, REQUEST):
                await vfs.read(fh, offset, REQUEST)
            assert handle.ahead == 12 + READAHEAD // CHUNK  # twice 12 chunks: over the limit
            for offset in range(36 * CHUNK, 40 * CHUNK, REQUEST):  # a seek: a run of its own
                await vfs.read(fh, offset, REQUEST)
            assert handle.ahead == 40 + 4 // 2
            await vfs.release(fh)
            nursery.cancel_scope.cancel()

    trio.run(scenario)


def test_evicted_chunks_are_let_go_of_off_the_event_loop(tmp_path):
    """The last reference to an evicted chunk dies in the dropper's thread, not the FUSE thread.

    Fetch processes hand over chunks as memory maps, and letting go of one unmaps it. Here the
    store's chunks are copied into anonymous maps to see in which thread each one goes.
    """
    released: list[str] = []

    def mapped(get_chunk):
        def get(ref):
            data = get_chunk(ref)
            chunk = mmap.mmap(-1, len(data))
            chunk.write(data)
            weakref.finalize(chunk, lambda: released.append(threading.current_thread().name))
            return memoryview(chunk)
        return get

    async def scenario() -> None:
        vfs = Vfs(Store.open(DirectoryBackend(str(tmp_path)), CpuEngine()), CONFIG)
        async with trio.open_nursery() as nursery:
            vfs.start(nursery)
            data = os.urandom(SIZE)
            await stored_file(vfs, data)
            small = VfsConfig(chunk_size=CHUNK, cache_size=4 * CHUNK, readahead=2 * CHUNK, threads=4)
            reader = Vfs(vfs.store, small)
            reader.store.chunks.get = mapped(reader.store.chunks.get)
            reader.start(nursery)
            fh = await reader.open((await reader.lookup(ROOT_INO, "ckpt")).ino, os.O_RDONLY)
            for offset in range(0, SIZE, REQUEST):
                assert await reader.read(fh, offset, REQUEST) == data[offset : offset + REQUEST]
            await reader.release(fh)
            await reader.shutdown()  # the dropper has let go of everything handed to it
            evicted.extend(released)  # not the chunks still cached: they go with the reader
            nursery.cancel_scope.cancel()

    evicted: list[str] = []
    trio.run(scenario)
    assert len(evicted) >= SIZE // CHUNK - 4, "evicted chunks are still held"
    assert threading.main_thread().name not in evicted, "the FUSE thread unmapped evicted chunks"
