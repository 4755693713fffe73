"""A pyfuse3 filesystem that does no work: the ceiling of the Python FUSE path on a machine.

It keeps names and sizes in one flat root directory and drops every byte written to it
(counting them: ``getxattr(root, user.nullfs.stats)`` gives the count as JSON). Optionally it
serves one read-only file ``data`` of a given size whose reads reply with views of 64 MiB of
random bytes made at mount, from heap memory or from a memfd map (the memory nvfs's fetch
processes hand decoded chunks over in). ``enable_writeback_cache``, the pyfuse3 options and
(unless ``cached``) the choice of ``direct_io`` are those of nvfs, so the kernel's paths are the
same as into nvfs and only nvfs's own work is missing.

It runs as a process of its own (:class:`NullFs` starts it as
``python3 -m benchmarks.harness.null_fs``), like a real daemon, and imports neither torch nor
anything of the benchmark that starts it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import mmap
import os
import select
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness.files import log_tail
from benchmarks.harness.mounts import is_mounted, lazy_unmount
from benchmarks.harness.units import MIB

STATS_XATTR = b"user.nullfs.stats"
DATA_NAME = b"data"
REPLY_SOURCE = 64 * MIB  # the data file repeats this many random bytes made at mount
READY = "ready"
REPO = Path(__file__).resolve().parents[2]


def reply_source(kind: str) -> memoryview:
    """``REPLY_SOURCE`` random bytes in heap memory, or in a memfd mapped as a fetched chunk is."""
    pattern = os.urandom(MIB) * (REPLY_SOURCE // MIB)
    if kind == "heap":
        return memoryview(bytearray(pattern))
    memfd = os.memfd_create("null-reply", os.MFD_CLOEXEC)
    try:
        os.ftruncate(memfd, REPLY_SOURCE)
        os.pwrite(memfd, pattern, 0)
        # The flags nvfs/store/chunk_processes/lanes.py (CHUNK_MAP_FLAGS) maps chunks with.
        return memoryview(mmap.mmap(memfd, REPLY_SOURCE, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                                    prot=mmap.PROT_READ))
    finally:
        os.close(memfd)


def make_operations(cached: bool, data_size: int, replies: memoryview | None) -> Any:
    """The pyfuse3 ``Operations`` of the null filesystem (pyfuse3 imported only in its process)."""
    import pyfuse3

    from nvfs.fuse.operations import writes_direct

    root = pyfuse3.ROOT_INODE

    class NullOperations(pyfuse3.Operations):
        supports_dot_lookup = True
        enable_writeback_cache = True

        def __init__(self) -> None:
            super().__init__()
            self.names: dict[bytes, int] = {}
            self.sizes: dict[int, int] = {}
            self.modes: dict[int, int] = {root: stat.S_IFDIR | 0o755}
            self.next_ino = root + 1
            self.data_ino = 0
            self.bytes_written = self.writes = self.largest_write = 0
            if data_size:
                self.data_ino = self._add(DATA_NAME, stat.S_IFREG | 0o444)
                self.sizes[self.data_ino] = data_size

        def _add(self, name: bytes, mode: int) -> int:
            inode = self.names[name] = self.next_ino
            self.next_ino += 1
            self.modes[inode] = mode
            return inode

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

        def _file_info(self, inode: int, flags: int, created: bool) -> pyfuse3.FileInfo:
            return pyfuse3.FileInfo(fh=inode, direct_io=not cached and writes_direct(flags, created),
                                    keep_cache=inode == self.data_ino)

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
            inode = self.names.get(name) or self._add(name, stat.S_IFREG | stat.S_IMODE(mode))
            self.sizes[inode] = 0
            return self._file_info(inode, flags, created=True), self._attrs(inode)

        async def open(self, inode, flags, ctx):
            if inode not in self.modes:
                raise pyfuse3.FUSEError(errno.ENOENT)
            if flags & os.O_TRUNC:
                self.sizes[inode] = 0
            return self._file_info(inode, flags, created=False)

        async def read(self, fh, off, size):
            length = max(0, min(size, self.sizes.get(fh, 0) - off))
            if fh != self.data_ino or replies is None:
                return bytes(length)
            # A view, as nvfs replies from a cached chunk. A short reply would read as the
            # end of the file: one crossing the end of the source (once per 64 MiB) is joined.
            start = off % REPLY_SOURCE
            if start + length <= REPLY_SOURCE:
                return replies[start : start + length]
            return bytes(replies[start:]) + bytes(replies[: start + length - REPLY_SOURCE])

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
            if inode == root and name == STATS_XATTR:
                return json.dumps({"bytes": self.bytes_written, "writes": self.writes,
                                   "largest_write": self.largest_write}).encode()
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    return NullOperations()


def serve(args: argparse.Namespace) -> int:
    """Mount and serve until unmounted or signalled; print ``ready`` once the mount answers."""
    import pyfuse3
    import trio

    from nvfs.daemon import set_kernel_readahead

    replies = reply_source(args.replies) if args.data_size else None
    operations = make_operations(args.cached, args.data_size, replies)
    mountpoint = args.mountpoint

    async def announce() -> None:
        await trio.to_thread.run_sync(os.stat, mountpoint)  # INIT is through
        if args.readahead_kib:
            set_kernel_readahead(mountpoint, args.readahead_kib << 10)
        print(READY, flush=True)

    async def stop_on_signal() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                pyfuse3.terminate()
                return

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_on_signal)
            nursery.start_soon(announce)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    pyfuse3.init(operations, mountpoint, set(pyfuse3.default_options) | {"fsname=nullfs", "subtype=nullfs"})
    try:
        trio.run(main)
    finally:
        pyfuse3.close(unmount=True)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("mountpoint")
    parser.add_argument("--cached", action="store_true",
                        help="no direct_io: every write through the page cache")
    parser.add_argument("--data-size", type=int, default=0,
                        help="bytes of the read-only file 'data' (default: none)")
    parser.add_argument("--replies", choices=("heap", "memfd"), default="heap",
                        help="where the data file's replies come from (default heap)")
    parser.add_argument("--readahead-kib", type=int, default=0,
                        help="the kernel's read-ahead on the mount (default: the kernel's own)")
    return parser.parse_args(argv)


class NullFs:
    """The null filesystem in a process of its own, mounted on ``mnt`` until :meth:`close`."""

    def __init__(self, mnt: Path, log: Path, *options: str) -> None:
        self.mnt, self.log = mnt, log
        mnt.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.harness.null_fs", str(mnt), *options], cwd=REPO,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log_file, text=True,
                start_new_session=True)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        if not ready or self.proc.stdout.readline().strip() != READY:
            self.close()
            raise RuntimeError(f"null filesystem did not mount (exit {self.proc.poll()}): {log_tail(log)}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stats(self) -> dict[str, int]:
        """Bytes and write calls received so far, and the largest write."""
        return json.loads(os.getxattr(self.mnt, STATS_XATTR.decode()))

    def umount(self) -> None:
        """Unmount cleanly and wait for the process to exit."""
        subprocess.run(["fusermount3", "-u", str(self.mnt)], check=True, capture_output=True, timeout=60)
        self.proc.wait(timeout=60)

    def close(self) -> None:
        """Unmount lazily if still mounted; stop the process, by force if it does not exit."""
        if is_mounted(self.mnt):
            lazy_unmount(self.mnt)
        if self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    sys.exit(serve(parse_args(None)))
