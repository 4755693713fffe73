"""Running a mount: FUSE session, trio loop, background detach, logging, clean shutdown."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyfuse3
import trio

from nvfs.backend.directory import OBJECT_MODE, make_private_dirs
from nvfs.fuse import Operations
from nvfs.gil import hand_over_quickly
from nvfs.heap import release_free_heap, tune_heap
from nvfs.options import MountOptions
from nvfs.store import Store
from nvfs.vfs import Vfs

log = logging.getLogger(__name__)

Ready = Callable[[str | None], None]
_MMAP_THRESHOLD = 64 << 20  # allocations below this come from the heap
_HEAP_KEPT = 64 << 20  # free memory an arena keeps for reuse
_ARENAS = 4  # each arena keeps its own free memory: few arenas, little kept
_WRITES_STOPPED_AFTER = 1.0  # seconds without a chunk upload that end a burst of writes
# Bytes the kernel reads ahead of a sequential reader (bdi read_ahead_kb), set once the kernel
# has the INIT reply (see _finish_mount). The window sets the size of FUSE read requests: a larger
# one came as more, smaller requests, each a round trip through the one FUSE thread
# (docs/decisions/kernel-readahead.md).
KERNEL_READAHEAD = 1 << 20
# Seconds the mount waits for its fetch and write processes to be ready (they import botocore
# and the codecs) before it reports ready anyway; reads meanwhile wait for them in threads.
PROCESSES_READY_WITHIN = 30.0


def mount_device(mountpoint: str) -> str | None:
    """``major:minor`` of the filesystem mounted on ``mountpoint``, from /proc/self/mountinfo.

    Read from the table, not by stat(2): the mount is ours and no request is served yet.
    """
    device = None
    with open("/proc/self/mountinfo") as table:
        for line in table:
            fields = line.split()
            if fields[4].encode().decode("unicode_escape") == mountpoint:
                device = fields[2]  # the last one: mounts stack
    return device


def set_kernel_readahead(mountpoint: str, size: int) -> None:
    """Let the kernel read ahead ``size`` bytes on this mount.

    The default (128 KiB) makes every sequential read a 128 KiB FUSE request, and each
    costs the same Python work however large it is. Needs root (it is a sysfs knob of the
    mount's bdi).
    """
    device = mount_device(mountpoint)
    knob = f"/sys/class/bdi/{device}/read_ahead_kb"
    try:
        if device is None:
            raise OSError(f"{mountpoint} is not in /proc/self/mountinfo")
        with open(knob, "w") as f:
            f.write(str(size >> 10))
    except OSError as exc:
        log.warning("kernel read-ahead stays at its default: cannot set %s: %s", knob, exc)
        return
    log.info("kernel read-ahead on %s: %d KiB", mountpoint, size >> 10)


def keep_chunk_buffers_in_heap() -> None:
    """Tell glibc's malloc to serve chunk-sized buffers from the heap and keep freed ones.

    By default every 4 MiB buffer (a download, a decoded chunk, a plane) is a fresh mmap
    whose pages the kernel faults in and zeroes, then an munmap
    (docs/decisions/chunk-buffers-in-heap.md). Freed memory above ``_HEAP_KEPT`` per arena still goes back,
    and the arenas are few, so the memory bound (``max_inflight``, ``cache_size``) holds.
    """
    if not tune_heap(_MMAP_THRESHOLD, _HEAP_KEPT, _ARENAS):
        log.debug("not glibc: malloc keeps its defaults")


def default_log_file(mountpoint: str) -> str:
    """Where a background daemon logs unless ``-o log_file=`` says otherwise."""
    name = mountpoint.strip("/").replace("/", "-") or "root"
    base = "/var/log/nvfs" if os.geteuid() == 0 else os.path.expanduser("~/.local/state/nvfs")
    return os.path.join(base, f"{name}.log")


def _create_private_log(log_file: str) -> None:
    """Create the log file and its missing directories for the owner only (file names are in it).

    0600 and 0700 whatever the umask; a log file that exists already keeps its mode.
    """
    make_private_dirs(Path(log_file).absolute().parent)
    try:
        fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, OBJECT_MODE)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, OBJECT_MODE)
    finally:
        os.close(fd)


def setup_logging(log_file: str | None, level: str) -> None:
    handler: logging.Handler
    if log_file:
        _create_private_log(log_file)
        handler = logging.FileHandler(log_file)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for chatty in ("botocore", "boto3", "urllib3", "s3transfer"):  # request dumps, even at debug
        logging.getLogger(chatty).setLevel(logging.WARNING)
    threading.excepthook = _log_thread_failure


def _log_thread_failure(args: threading.ExceptHookArgs) -> None:
    """A background thread died of a bug: say so in the log (a daemon's stderr goes nowhere)."""
    thread = args.thread.name if args.thread is not None else "?"
    log.critical("thread %s failed", thread, exc_info=(args.exc_type, args.exc_value, args.exc_traceback))


def serve(store: Store, source: str, mountpoint: str, options: MountOptions, ready: Ready) -> int:
    """Mount, report readiness, serve requests until unmounted or signalled; returns an exit code."""
    keep_chunk_buffers_in_heap()
    hand_over_quickly()
    store.backend.start_background()
    vfs = Vfs(store, options.vfs)
    fuse_options = set(pyfuse3.default_options) | {f"fsname={source}", "subtype=nvfs"} | options.fuse
    try:
        pyfuse3.init(Operations(vfs, not options.cached_writes), mountpoint, fuse_options)
    except RuntimeError as exc:
        ready(f"cannot mount on {mountpoint}: {exc}")
        return 1
    pool = store.fetch_pool
    fetching = f"{pool.processes} fetch processes of {pool.lanes} lanes" if pool else "fetches in the daemon"
    if store.write_pool is not None:
        fetching += f", {store.write_pool.processes} write processes of {store.write_pool.lanes} lanes"
    log.info("mounted %s on %s: engine %s (asked for %s), chunk size %d, %s", source, mountpoint,
             store.engine.name, options.engine, options.vfs.chunk_size, fetching)
    try:
        trio.run(_serve_until_unmounted, vfs, mountpoint, ready)
    except BaseException:
        log.exception("the daemon failed")
        raise
    finally:
        pyfuse3.close(unmount=True)
        store.close()
        log.info("unmounted %s", mountpoint)
    return 0


async def _serve_until_unmounted(vfs: Vfs, mountpoint: str, ready: Ready) -> None:
    async with trio.open_nursery() as nursery:
        vfs.start(nursery)
        nursery.start_soon(_release_memory_after_writes, vfs)
        nursery.start_soon(_terminate_on_signal)
        nursery.start_soon(_finish_mount, vfs.store, mountpoint, ready)
        await pyfuse3.main()
        log.info("FUSE session ended; committing and draining")
        await vfs.shutdown()
        nursery.cancel_scope.cancel()


async def _release_memory_after_writes(vfs: Vfs) -> None:
    """Once writing has stopped for a moment, give the heap's free memory back to the kernel.

    Writing goes through up to ``max_inflight`` bytes of chunk buffers and their encoded
    copies; freed, they stayed in the heap: the daemon kept 275 MiB after writing 2 GiB with
    16 threads, and a restore on the same mount then went over the memory bound. Not at every
    drain: a writer slower than the uploads drains them many times a second, and each trim
    would hand back pages that the next chunks fault in again.
    """
    while True:
        await vfs.uploads_drained()
        while True:  # until no upload has started for a while
            started = vfs.upload_count()
            await trio.sleep(_WRITES_STOPPED_AFTER)
            if vfs.upload_count() == started:
                break
        await trio.to_thread.run_sync(release_free_heap)
        await trio.to_thread.run_sync(vfs.store.release_idle_buffers)


async def _finish_mount(store: Store, mountpoint: str, ready: Ready) -> None:
    """Widen the kernel's read-ahead once it has the INIT reply; report ready once the processes are.

    The kernel sets a mount's read-ahead from the INIT reply, never above its 128 KiB default,
    so a wider window set before the reply is undone: it was, until this waited (read_ahead_kb
    read 128 after the daemon had written 1024). The stat of the mount's root returns only
    once INIT is through; files opened after ``nvfs mount`` returns get the wide window. A
    restore begun as soon as the mount returned found its fetch processes still importing.
    """
    try:
        await trio.to_thread.run_sync(os.stat, mountpoint)
    except OSError as exc:
        ready(f"{mountpoint} does not answer after mounting: {exc}")
        pyfuse3.terminate()
        return
    set_kernel_readahead(mountpoint, KERNEL_READAHEAD)
    await _wait_for_processes(store)
    ready(None)


async def _wait_for_processes(store: Store) -> None:
    """Wait (bounded) for the store's fetch and write processes; log how long they took."""
    count = sum(pool.processes for pool in store.process_pools())
    if not count:
        return
    started = time.monotonic()
    if await trio.to_thread.run_sync(store.wait_for_processes, PROCESSES_READY_WITHIN):
        log.info("chunk processes ready after %.2f s (%d)", time.monotonic() - started, count)
    else:
        log.warning("chunk processes not all ready after %.2f s: mounted without them; "
                    "reads and writes wait for them in threads", time.monotonic() - started)


async def _terminate_on_signal() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("received %s: unmounting", signal.Signals(signum).name)
            pyfuse3.terminate()
            return


def run_in_background(run: Callable[[Ready], int]) -> int:
    """Fork a daemon that runs ``run``; return once it reports the mount ready (0) or failed (1)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            message = pipe.read().decode(errors="replace")
        if message == "ok":
            return 0
        print(f"nvfs: {message or 'the daemon exited before the mount was ready (see its log)'}",
              file=sys.stderr)
        return 1
    os.close(read_end)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)

    def ready(error: str | None) -> None:
        os.write(write_end, (error or "ok").encode())
        os.close(write_end)

    code = 1
    try:
        code = run(ready)
    finally:
        logging.shutdown()
        os._exit(code)
