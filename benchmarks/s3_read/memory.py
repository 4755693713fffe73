"""Part 3 of the S3 read scenario: the daemon's peak memory while a large file is written and read.

The bound it is held to is ``cache_size + max_inflight + 256 MiB`` of the mount's options.
"""

from __future__ import annotations

import argparse
import math
import os
import struct
import time
from pathlib import Path

import numpy as np

from benchmarks.harness.files import drop_caches, timed_cat
from benchmarks.harness.mounts import XATTR
from benchmarks.harness.report import Check
from benchmarks.harness.rss import RssSampler, rss_with_fetch_processes
from benchmarks.harness.units import MIB, human
from benchmarks.s3_read.cold_reads import s3_mount
from benchmarks.s3_read.table import Results, Row
from nvfs.testing.procfs import proc_status, tree_cpu_seconds, tree_status
from nvfs.testing.seaweed import SeaweedServer

HEADROOM = 256 * MIB  # the RSS bound is cache_size + max_inflight + this
BLOCK = 4 * MIB  # write size of the RSS run


def block_pool(seed: int) -> bytes:
    """64 MiB + one block of N(0, 0.02) fp32 values rounded to bf16 precision: ~2-3x compressible."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal((64 * MIB + BLOCK) // 4, dtype=np.float32) * 0.02).view(np.uint32)
    return (values & np.uint32(0xFFFF0000)).tobytes()


def block(pool: bytes, index: int) -> bytes:
    """Block ``index`` of the RSS file: a window into the pool, made unique by a 16-byte stamp."""
    offset = (index * 2_654_435_761 % (64 * MIB // 4)) * 4
    return struct.pack("<QQ", index, 0x6E766673) + pool[offset + 16 : offset + BLOCK]


def part3(args: argparse.Namespace, server: SeaweedServer, work: Path, results: Results,
          options: str, bound: int) -> None:
    blocks = args.rss_mib * MIB // BLOCK
    size = blocks * BLOCK
    pool = block_pool(args.seed + 2)
    mount = s3_mount(server, "rss", work, "rss", options)
    path = mount.mnt / "big.bin"
    try:
        pid = mount.mount()
        idle_rss = tree_status(pid, "VmRSS")
        sampler = RssSampler(pid, rss_with_fetch_processes)
        try:
            sampler.phase = "write"
            cpu0 = tree_cpu_seconds(pid)
            start = time.perf_counter()
            with open(path, "wb", buffering=0) as f:
                for i in range(blocks):
                    f.write(block(pool, i))
            write_s = time.perf_counter() - start
            write_cpu = tree_cpu_seconds(pid) - cpu0
            stored = int(os.getxattr(path, XATTR + "stored_size"))
            write_peak = sampler.peak
            sampler.phase = "read"
            drop_caches()
            cpu0 = tree_cpu_seconds(pid)
            read_s = timed_cat(path)
            read_cpu = tree_cpu_seconds(pid) - cpu0
            hwm = tree_status(pid, "VmHWM")
            own_hwm = proc_status(pid, "VmHWM")
        finally:
            sampler.stop()
        # Spot check (untimed): a few blocks read back equal what was written.
        with open(path, "rb", buffering=0) as f:
            for i in sorted({0, blocks - 1, blocks // 3, blocks // 2, (2 * blocks) // 3}):
                f.seek(i * BLOCK)
                if f.read(BLOCK) != block(pool, i):
                    raise AssertionError(f"block {i} of {path.name} reads back different")
    finally:
        mount.close()
    peak = max(sampler.peak, hwm)
    results.add(Row("3", f"nvfs write {human(size)} (4 MiB writes) + close", write_s, size,
                    detail=f"stored {human(stored)} (ratio {size / stored:.2f}x), "
                           f"daemon CPU {write_cpu:.1f} s, peak VmRSS while writing {human(write_peak)}"))
    results.add(Row("3", f"nvfs cold read {human(size)}: cat > /dev/null", read_s, size,
                    detail=f"daemon CPU {read_cpu:.1f} s; spot-checked 5 blocks bit-exact"))
    results.add(Row("3", "daemon peak RSS over write + read", math.nan, None,
                    detail=f"daemon + fetch processes: sampled VmRSS peak {human(sampler.peak)} "
                           f"(during {sampler.peak_phase}, {sampler.samples} samples), VmHWM {human(hwm)}, "
                           f"idle after mount {human(idle_rss)}; bound {human(bound)}; daemon alone: "
                           f"VmHWM {human(own_hwm)}"))
    results.acceptance.append(Check(
        "daemon peak RSS < cache_size + max_inflight + 256 MiB",
        peak < bound,
        f"peak {human(peak)} (max of sampled VmRSS and VmHWM) vs bound {human(bound)} "
        f"= {peak / bound:.0%} of it"))
