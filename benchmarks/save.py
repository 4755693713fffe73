"""Time ``torch.save`` / ``torch.load`` of a ~1 GiB mixed-precision checkpoint: plain directory vs nvfs.

Why this benchmark: nvfs exists to make checkpoint saves cheaper in bytes without making them
slower in wall time, so the honest comparison is the same ``torch.save`` call, with the same
durability guarantee, into a plain directory and into an nvfs mount, both on the same disk.

* Both targets: ``torch.save`` then ``fsync`` (without fsync the bytes may still sit in the
  page cache; on nvfs the commit follows the last close and fsync waits for it). Whether
  nvfs's commit really happened is checked through the ``user.nvfs.committed`` xattr.

Loads are cold: the plain file and the store's objects are evicted from the page cache
(``posix_fadvise(DONTNEED)``) and nvfs is remounted, so neither side reads from memory.

The checkpoint is :mod:`benchmarks.harness.checkpoint`'s seeded training state.

Run as root (FUSE), from the repository root::

    python3 -m benchmarks.save --size-mib 1024
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import cli
from benchmarks.harness.checkpoint import build_described, choose_shape, timed_save, verify
from benchmarks.harness.files import evict, evict_tree, log_tail, tree_bytes
from benchmarks.harness.mounts import XATTR, NvfsMount
from benchmarks.harness.report import Result


@dataclass
class Row:
    """One row of the table."""

    target: str
    logical: int
    stored: int
    save_s: float
    load_s: float = math.nan
    note: str = ""


def timed_load(path: Path, state: dict[str, Any]) -> float:
    """Seconds for ``torch.load``; then check every tensor against the original, bit for bit."""
    start = time.perf_counter()
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    elapsed = time.perf_counter() - start
    verify(state, loaded)
    del loaded
    gc.collect()
    return elapsed


def bench_plain(state: dict[str, Any], directory: Path) -> Row:
    """Save + fsync into a plain directory, then a cold load."""
    directory.mkdir()
    path = directory / "ckpt.pt"
    save_s = timed_save(state, path, fsync=True)
    size = path.stat().st_size
    row = Row("plain dir", size, size, save_s, note="torch.save + fsync")
    evict(path)
    row.load_s = timed_load(path, state)
    return row


def bench_nvfs(state: dict[str, Any], work: Path, engine: str, mount_options: str | None) -> Row:
    """Save into a fresh nvfs mount (durable once fsync returns), unmount, remount, then a cold load."""
    work = work / f"nvfs-{engine}"
    store = work / "store"
    store.mkdir(parents=True)
    mount = NvfsMount(str(store), work / "mnt", work / "nvfs.log",
                      ",".join(filter(None, (f"engine={engine}", mount_options))))
    try:
        with mount.mounted() as mnt:
            path = mnt / "ckpt.pt"
            save_s = timed_save(state, path, fsync=True)  # the commit follows close; fsync waits for it
            committed = os.getxattr(path, XATTR + "committed").decode()
            xattr_stored = int(os.getxattr(path, XATTR + "stored_size"))
            logical = path.stat().st_size
            umount_start = time.perf_counter()
        umount_s = time.perf_counter() - umount_start
        note = (f"committed after fsync: {committed}; xattr stored_size {xattr_stored}; "
                f"umount {umount_s:.2f}s")
        row = Row(f"nvfs {engine}", logical, tree_bytes(store), save_s, note=note)
        evict_tree(store)
        with mount.mounted() as mnt:
            row.load_s = timed_load(mnt / "ckpt.pt", state)
        return row
    except Exception:
        print(f"{mount.log} (last 30 lines):\n{log_tail(mount.log)}", file=sys.stderr)
        raise


def print_table(rows: list[Row]) -> None:
    """The one table: seconds, logical GB/s (1 GB = 1e9 bytes), stored bytes and ratio."""
    header = (f"{'target':<10} {'save s':>8} {'save GB/s':>10} {'load s':>8} {'load GB/s':>10} "
              f"{'logical bytes':>14} {'stored bytes':>14} {'ratio':>7}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.target:<10} {r.save_s:>8.2f} {r.logical / r.save_s / 1e9:>10.3f} {r.load_s:>8.2f} "
              f"{r.logical / r.load_s / 1e9:>10.3f} {r.logical:>14,} {r.stored:>14,} "
              f"{r.logical / r.stored:>6.3f}x")
    for r in rows:
        print(f"  {r.target}: {r.note}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.save", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="training state size (default 1024)")
    parser.add_argument("--mount-options", default=None, help="extra nvfs -o options, e.g. level=1,threads=8")
    parser.add_argument("--engines", default="auto",
                        help="nvfs engines to compare, comma-separated (auto, cpu, gpu; default auto)")
    parser.add_argument("--hidden", type=int, default=None, help="hidden size (default: by size)")
    parser.add_argument("--adam-steps", type=int, default=3, help="AdamW steps to build optimizer state")
    cli.add_common_args(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with cli.workdir(args, "save") as work:
        result = Result("save", args, cli.print_header(work))
        started = time.perf_counter()
        state = build_described(choose_shape(args.size_mib << 20, args.hidden), args.seed, args.adam_steps)
        rows = [bench_plain(state, work / "plain")]
        rows += [bench_nvfs(state, work, engine, args.mount_options) for engine in args.engines.split(",")]
        print()
        print_table(rows)
        print(f"\ntotal runtime {time.perf_counter() - started:.1f}s")
        result.rows = rows
        result.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
