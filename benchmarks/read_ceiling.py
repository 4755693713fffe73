"""How close nvfs's read path comes to what a Python FUSE filesystem can serve at all.

pyfuse3 answers every request on one thread, and it copies a read's reply to the kernel
holding the GIL. So one sequential reader is bounded by that thread, whatever the store. This
script times ``cat FILE > /dev/null`` (page cache dropped before each) of one file through:

1. **null FUSE**, :mod:`benchmarks.harness.null_fs` serving a file whose ``read`` returns a
   view into 64 MiB of random bytes made at mount, with the kernel's read-ahead on the mount at
   1 MiB as nvfs sets it (1 MiB requests):
   a. replies from heap memory;
   b. replies from memfd maps, the memory fetch processes hand decoded chunks over in;
   c. at the kernel's default read-ahead of 128 KiB (128 KiB requests), heap memory;
2. **nvfs on a directory store** (``-o engine=cpu,cache_size=`` above the file's size):
   a. every chunk in the daemon's memory cache (the file read once before);
   b. a fresh mount, the store's files in the page cache: each chunk read, checked and
      decoded by the daemon while the reader waits.

Each row is the median of ``--rounds`` reads; "x null" is its share of row 1a. The file is a
seeded training state (:mod:`benchmarks.harness.checkpoint`) saved with ``torch.save``,
written through nvfs for row 2 and served as its size in bytes by the null filesystem.

Run as root (FUSE, drop_caches), from the repository root::

    python3 -m benchmarks.read_ceiling --quick     # 256 MiB, smoke run
    python3 -m benchmarks.read_ceiling             # 2 GiB, 3 rounds
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks.harness import cli
from benchmarks.harness.checkpoint import build_state, fit_shape
from benchmarks.harness.files import drop_caches, read_files_below, timed_cat
from benchmarks.harness.mounts import NvfsMount
from benchmarks.harness.null_fs import DATA_NAME, NullFs
from benchmarks.harness.report import Result, median
from benchmarks.harness.units import MIB, human

NULL_ROWS = (("1a null FUSE, 1 MiB requests, heap replies", "heap", 1024),
             ("1b null FUSE, 1 MiB requests, memfd-map replies", "memfd", 1024),
             ("1c null FUSE, 128 KiB requests, heap replies", "heap", 128))


@dataclass
class Row:
    name: str
    size: int
    seconds: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return median(self.seconds)

    @property
    def gbps(self) -> float:
        return self.size / self.median / 1e9


def cold_cat(path: Path) -> float:
    """:func:`timed_cat` with the page cache dropped first."""
    drop_caches()
    return timed_cat(path)


def null_row(work: Path, name: str, source: str, size: int, readahead_kib: int, rounds: int) -> Row:
    """One null-filesystem row: its data file of ``size`` bytes read ``rounds`` times, cold."""
    mnt = work / f"mnt-null-{source}-{readahead_kib}"
    null = NullFs(mnt, work / f"null-{source}-{readahead_kib}.log", "--data-size", str(size),
                  "--replies", source, "--readahead-kib", str(readahead_kib))
    row = Row(name, size)
    try:
        for _ in range(rounds):
            row.seconds.append(cold_cat(mnt / DATA_NAME.decode()))
        null.umount()
    finally:
        null.close()
    return row


def nvfs_rows(work: Path, size_mib: int, seed: int, rounds: int) -> list[Row]:
    """Rows 2a and 2b: one file saved through nvfs, read from its memory cache and from the store."""
    cache = max(2 * size_mib, 1024)
    store = work / "store"
    store.mkdir()
    nvfs = NvfsMount(str(store), work / "mnt-nvfs", work / "nvfs.log", f"engine=cpu,cache_size={cache}M")
    nvfs.mount()
    path = nvfs.mnt / "ckpt.pt"
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
            nvfs.remount()
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
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.read_ceiling",
                                     description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size-mib", type=int, default=2048, help="size of the file read (default 2048)")
    parser.add_argument("--rounds", type=int, default=3, help="reads per row; medians count (default 3)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 256 MiB, 2 rounds")
    cli.add_common_args(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.size_mib, args.rounds = 256, 2
    if args.rounds < 1 or args.size_mib < 1:
        parser.error("--rounds and --size-mib must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with cli.workdir(args, "read") as work:
        result = Result("read_ceiling", args, cli.print_header(work))
        stored = nvfs_rows(work, args.size_mib, args.seed, args.rounds)
        rows = [null_row(work, name, source, stored[0].size, readahead_kib, args.rounds)
                for name, source, readahead_kib in NULL_ROWS]
        print_table([*rows, *stored])
        result.rows = [{"name": r.name, "size": r.size, "median_s": r.median, "gbps": r.gbps,
                        "trials_s": r.seconds} for r in [*rows, *stored]]
        result.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
