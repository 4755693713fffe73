"""Read-ahead of a sequential reader whose requests finish out of order (nvfs/vfs/filesystem.py).

The kernel sends a sequential reader's requests several at a time; they finish in whatever
order their chunks arrive. Judged by the order they finish in, a reader looked as if it
seeked every few MiB, and its read-ahead window never grew. Here a real store on a directory
gets the kernel's pattern straight from trio, whose scheduler runs woken tasks in either
order on purpose, so the requests of a batch finish in both orders.
"""

from __future__ import annotations

import os

import trio
import trio.testing

from nvfs.backend.directory import DirectoryBackend
from nvfs.codec.cpu import CpuEngine
from nvfs.store import Store
from nvfs.vfs import ROOT_INO, Vfs, VfsConfig

CHUNK = 1 << 20
REQUEST = CHUNK  # one chunk each: a batch spans more than the one chunk of reordering tolerated
IN_FLIGHT = 4  # requests the kernel has out at once
SIZE = 48 * CHUNK
READAHEAD = 16 * CHUNK


def test_requests_finishing_out_of_order_keep_a_sequential_reader_sequential(tmp_path):
    data = os.urandom(SIZE)
    config = VfsConfig(chunk_size=CHUNK, cache_size=64 * CHUNK, readahead=READAHEAD, threads=4)

    async def scenario() -> None:
        vfs = Vfs(Store.open(DirectoryBackend(str(tmp_path)), CpuEngine()), config)
        async with trio.open_nursery() as nursery:
            vfs.start(nursery)
            fh, node = await vfs.create(ROOT_INO, "ckpt", 0o644, 0, 0, os.O_WRONLY)
            await vfs.write(fh, 0, data)
            await vfs.flush(fh)
            await vfs.release(fh)

            reader = Vfs(vfs.store, config)  # a fresh cache: every chunk comes from the store
            reader.start(nursery)
            ino = (await reader.lookup(ROOT_INO, "ckpt")).ino
            fh = await reader.open(ino, os.O_RDONLY)
            got = bytearray(SIZE)

            async def read(offset: int) -> None:
                got[offset : offset + REQUEST] = await reader.read(fh, offset, REQUEST)

            for batch in range(0, SIZE, IN_FLIGHT * REQUEST):
                async with trio.open_nursery() as requests:
                    for offset in range(batch, batch + IN_FLIGHT * REQUEST, REQUEST):
                        requests.start_soon(read, offset)
                        await trio.testing.wait_all_tasks_blocked()  # it has arrived: send the next
            handle = reader.handle(fh)
            assert handle.streak == SIZE, "a request finishing early was taken for a seek"
            assert handle.ahead == SIZE // CHUNK  # the window grew to the end of the file
            assert bytes(got) == data
            await reader.release(fh)
            nursery.cancel_scope.cancel()

    trio.run(scenario)
