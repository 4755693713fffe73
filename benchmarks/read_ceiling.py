"""How close nvfs's read path comes to what a Python FUSE filesystem can serve at all.

pyfuse3 answers every request on one thread, and it copies a read's reply to the kernel
holding the GIL. So one sequential reader is bounded by that thread, whatever the store. This
script times ``cat FILE > /dev/null`` (page cache dropped before each) of one file through:

1. **null FUSE**, a pyfuse3 filesystem defined here, run as its own process
   (``--serve-null``), whose ``read`` returns a view into 64 MiB of random bytes made at mount,
   with the kernel's read-ahead on the mount at 1 MiB as nvfs sets it (1 MiB requests):
   a. replies from heap memory;
   b. replies from memfd maps, the memory fetch processes hand decoded chunks over in;
   c. at the kernel's default read-ahead of 128 KiB (128 KiB requests), heap memory;
2. **nvfs on a directory store** (``-o engine=cpu,cache_size=`` above the file's size):
   a. every chunk in the daemon's memory cache (the file read once before);
   b. a fresh mount, the store's files in the page cache: each chunk read, checked and
      decoded by the daemon while the reader waits.

Each row is the median of ``--rounds`` reads; "x null" is its share of row 1a. The file is a
seeded training state saved with ``torch.save`` (``benchmarks/save.py``'s builder), written
through nvfs for row 2 and served as its size in bytes by the null filesystem.

Run as root (FUSE, drop_caches)::

    python3 benchmarks/read_ceiling.py --quick     # 256 MiB, smoke run
    python3 benchmarks/read_ceiling.py             # 2 GiB, 3 rounds
"""

from __future__ import annotations

import argparse
import mmap
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.common import MIB, drop_caches, human, make_workdir, raise_on_sigterm, timed_cat  # noqa: E402

REPLY_SOURCE = 64 * MIB  # the null filesystem's file repeats this many bytes made at mount
READY = "ready"


# ----- the null filesystem (its own process: --serve-null MOUNTPOINT SOURCE SIZE READAHEAD_KIB) -----

def reply_source(kind: str) -> memoryview:
    """``REPLY_SOURCE`` random bytes in heap memory, or in a memfd mapped as a fetched chunk is."""
    pattern = os.urandom(MIB) * (REPLY_SOURCE // MIB)
    if kind == "heap":
        return memoryview(bytearray(pattern))
    memfd = os.memfd_create("null-reply", os.MFD_CLOEXEC)
    try:
        os.ftruncate(memfd, REPLY_SOURCE)
        os.pwrite(memfd, pattern, 0)
        # The flags nvfs/store/chunk_processes/ maps chunks with.
        return memoryview(mmap.mmap(memfd, REPLY_SOURCE, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                                    prot=mmap.PROT_READ))
    finally:
        os.close(memfd)


def serve_null(mountpoint: str, source: str, size: int, readahead_kib: int) -> int:
    """Serve one read-only file ``data`` of ``size`` bytes; print ``ready`` once it can be read."""
    import pyfuse3
    import trio

    from nvfs.daemon import set_kernel_readahead

    replies = reply_source(source)

    class NullReads(pyfuse3.Operations):
        enable_writeback_cache = True  # as nvfs on a store of its own: the kernel's paths stay the same

        async def getattr(self, inode, ctx=None):
            attributes = pyfuse3.EntryAttributes()
            attributes.st_ino = inode
            is_root = inode == pyfuse3.ROOT_INODE
            attributes.st_mode = (stat.S_IFDIR | 0o755) if is_root else (stat.S_IFREG | 0o444)
            attributes.st_size = 0 if is_root else size
            attributes.st_nlink = 1
            return attributes

        async def lookup(self, parent_inode, name, ctx=None):
            if parent_inode != pyfuse3.ROOT_INODE or name != b"data":
                raise pyfuse3.FUSEError(2)  # ENOENT
            return await self.getattr(pyfuse3.ROOT_INODE + 1)

        async def open(self, inode, flags, ctx):
            return pyfuse3.FileInfo(fh=inode, keep_cache=True)

        async def read(self, fh, off, length):
            # A view, as nvfs replies from a cached chunk. A short reply would read as the
            # end of the file: one crossing the end of the source (once per 64 MiB) is joined.
            length = max(0, min(length, size - off))
            start = off % REPLY_SOURCE
            if start + length <= REPLY_SOURCE:
                return replies[start : start + length]
            return bytes(replies[start:]) + bytes(replies[: start + length - REPLY_SOURCE])

    pyfuse3.init(NullReads(), mountpoint, set(pyfuse3.default_options) | {"fsname=nullreads"})

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pyfuse3.main)
            await trio.to_thread.run_sync(os.stat, mountpoint)  # INIT is through
            set_kernel_readahead(mountpoint, readahead_kib << 10)
            print(READY, flush=True)

    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)
    return 0


# The benchmark proper needs torch; the null filesystem process above does not import it.
if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "--serve-null":
    sys.exit(serve_null(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))

import torch  # noqa: E402

from benchmarks.save import build_state, fit_shape, machine_info  # noqa: E402
from benchmarks.write import NvfsMount  # noqa: E402

# ----- measuring ----------------------------------------------------------------------------------

@dataclass
class Row:
    name: str
    size: int
    seconds: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return sorted(self.seconds)[(len(self.seconds) - 1) // 2]

    @property
    def gbps(self) -> float:
        return self.size / self.median / 1e9


def cold_cat(path: Path) -> float:
    """:func:`timed_cat` with the page cache dropped first."""
    drop_caches()
    return timed_cat(path)


def read_files_below(directory: Path) -> None:
    """Read every file under ``directory`` into the page cache."""
    buffer = bytearray(8 * MIB)
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buffer):
                    pass


def null_row(work: Path, name: str, source: str, size: int, readahead_kib: int, rounds: int) -> Row:
    mountpoint = work / f"mnt-null-{source}-{readahead_kib}"
    mountpoint.mkdir()
    command = [sys.executable, str(Path(__file__).resolve()), "--serve-null", str(mountpoint), source,
               str(size), str(readahead_kib)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    row = Row(name, size)
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != READY:
            raise RuntimeError(f"the null filesystem did not mount (exit {server.wait(10)})")
        for _ in range(rounds):
            row.seconds.append(cold_cat(mountpoint / "data"))
    finally:
        subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False)
        server.wait(30)
    return row


def nvfs_rows(work: Path, size_mib: int, seed: int, rounds: int) -> list[Row]:
    """Rows 2a and 2b: one file saved through nvfs, read from its memory cache and from the store."""
    cache = max(2 * size_mib, 1024)
    store, mountpoint = work / "store", work / "mnt-nvfs"
    store.mkdir()
    mountpoint.mkdir()
    nvfs = NvfsMount(str(store), mountpoint, work / "nvfs.log", f"engine=cpu,cache_size={cache}M")
    nvfs.mount()
    path = mountpoint / "ckpt.pt"
    try:
        started = time.perf_counter()
        torch.save(build_state(fit_shape(size_mib * MIB), seed, 3), path)
        size = path.stat().st_size
        print(f"saved {human(size)} through nvfs in {time.perf_counter() - started:.1f} s", flush=True)
        memory = Row("2a nvfs, every chunk in its memory cache", size)
        cold_cat(path)  # fills the cache
        for _ in range(rounds):
            memory.seconds.append(cold_cat(path))
        from_store = Row("2b nvfs, fresh mount, store files in the page cache", size)
        for _ in range(rounds):
            nvfs.umount()
            nvfs.mount()
            drop_caches()
            read_files_below(store)
            from_store.seconds.append(timed_cat(path))
    finally:
        nvfs.close()
    return [memory, from_store]


def print_table(rows: list[Row]) -> None:
    ceiling = rows[0].gbps
    print(f"\n{'read':<58} {'size':>10} {'median s':>9} {'GB/s':>7} {'x null':>7}  rounds (s)")
    for row in rows:
        trials = ", ".join(f"{seconds:.2f}" for seconds in row.seconds)
        print(f"{row.name:<58} {human(row.size):>10} {row.median:>9.2f} {row.gbps:>7.3f} "
              f"{row.gbps / ceiling:>7.2f}  {trials}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size-mib", type=int, default=2048, help="size of the file read (default 2048)")
    parser.add_argument("--rounds", type=int, default=3, help="reads per row; medians count (default 3)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 256 MiB, 2 rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="parent of the benchmark's fresh temp dir (default /var/tmp)")
    args = parser.parse_args(argv)
    if args.quick:
        args.size_mib, args.rounds = 256, 2
    if args.rounds < 1 or args.size_mib < 1:
        parser.error("--rounds and --size-mib must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    work = make_workdir(args.workdir, "nvfs-bench-read-")
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"machine: {machine_info(work)}", flush=True)
    try:
        stored = nvfs_rows(work, args.size_mib, args.seed, args.rounds)
        size = stored[0].size
        null = [("1a null FUSE, 1 MiB requests, heap replies", "heap", 1024),
                ("1b null FUSE, 1 MiB requests, memfd-map replies", "memfd", 1024),
                ("1c null FUSE, 128 KiB requests, heap replies", "heap", 128)]
        rows = [null_row(work, name, source, size, readahead_kib, args.rounds)
                for name, source, readahead_kib in null]
        print_table([*rows, *stored])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
