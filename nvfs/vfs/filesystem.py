"""The virtual filesystem the FUSE adapter calls: one facade over the parts that each hold their own state.

Everything here runs on the trio thread of the FUSE adapter. Handlers only touch memory
and hand blocking work (compression, storage I/O) to worker threads (:mod:`nvfs.vfs.workers`).

Semantics (docs/SEMANTICS.md): a file's new contents become durable and visible in
the store when the last handle that can write it is released, on fsync, or at unmount
(:mod:`nvfs.vfs.commits`); namespace operations (mkdir, rename, unlink, chmod, ...) are
durable when they return.

The parts, each given the ones it uses (a part refers only to parts listed before it):

- :class:`Workers`: worker-thread lanes and the nursery of background tasks;
- :class:`GarbageCollector`: collection passes on request;
- :class:`Inodes`: the node table and directory listings;
- :class:`OpenFiles`: handles and the contents of open files;
- :class:`ChunkCalls`: storing and fetching one chunk;
- :class:`Reader`: reads, the decoded-chunk cache, read-ahead;
- :class:`Writer`: writes, uploads, truncation;
- :class:`Committer`: flush, release and commits;
- :class:`Namespace`: making, removing and renaming entries.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable

import trio

from nvfs.store import Store
from nvfs.vfs.chunk_calls import ChunkCalls
from nvfs.vfs.commits import Committer
from nvfs.vfs.config import VfsConfig
from nvfs.vfs.errors import VfsError
from nvfs.vfs.garbage import GarbageCollector
from nvfs.vfs.handles import Handle, OpenFiles
from nvfs.vfs.inodes import Inodes
from nvfs.vfs.namespace import Namespace
from nvfs.vfs.node import Node, Stat
from nvfs.vfs.reader import Reader
from nvfs.vfs.workers import Workers
from nvfs.vfs.writer import Writer
from nvfs.vfs.xattrs import storage_xattrs

log = logging.getLogger(__name__)


class Vfs:
    """Inode table and file operations over a :class:`Store`."""

    def __init__(self, store: Store, config: VfsConfig) -> None:
        self.store = store
        self.config = config
        self._workers = Workers(config.threads)
        self._garbage = GarbageCollector(store, self._workers)
        self._inodes = Inodes(store, self._workers, self._garbage, config)
        self._files = OpenFiles(store, self._inodes, self._garbage, config)
        chunks = ChunkCalls(store, self._workers)
        self._reader = Reader(self._files, chunks, self._workers, config)
        self._writer = Writer(store, self._files, self._reader, chunks, self._garbage, self._workers, config)
        self._commits = Committer(store, self._inodes, self._files, self._writer, self._garbage,
                                  self._workers, config)
        self._namespace = Namespace(store, self._inodes, self._workers)

    # ----- lifecycle ----------------------------------------------------------------

    def start(self, nursery: trio.Nursery) -> None:
        """Run background work (uploads, read-ahead, garbage collection) in ``nursery``."""
        self._workers.start(nursery)
        self._reader.start()
        nursery.start_soon(self._garbage.run)
        self._garbage.request()  # clear out chunks orphaned by an earlier crash

    async def shutdown(self) -> None:
        """Commit whatever is still uncommitted (files left open at unmount) and drain."""
        await self._commits.wait_background_commits()
        for node in self._inodes.all():
            if node.needs_commit():
                try:
                    await self._commits.commit(node)
                except VfsError as exc:
                    log.error("%s: could not be committed at unmount: %s", node.display_path(), exc)
        await self._writer.wait_uploads()
        await self._garbage.wait_served()
        await self._reader.stop()

    async def uploads_drained(self) -> None:
        """Return the next time the last chunk upload in flight finishes: a burst of writes drained."""
        await self._writer.uploads_drained()

    def upload_count(self) -> int:
        """Chunk uploads started since the mount: it changes while anything is written."""
        return self._writer.upload_count()

    @property
    def invalidate_kernel_cache(self) -> Callable[[int, int | None, str], None]:
        """Called (in a worker thread) with an inode, its parent's inode and its name when the
        kernel must forget what it cached of a file; the FUSE adapter sets it."""
        return self._commits.invalidate_kernel_cache

    @invalidate_kernel_cache.setter
    def invalidate_kernel_cache(self, forget: Callable[[int, int | None, str], None]) -> None:
        self._commits.invalidate_kernel_cache = forget

    # ----- inodes and attributes ------------------------------------------------------

    def node(self, ino: int) -> Node:
        return self._inodes.node(ino)

    def remember(self, node: Node) -> None:
        """The kernel now holds one more reference to ``node`` (a lookup reply)."""
        self._inodes.remember(node)

    def forget(self, ino: int, count: int) -> None:
        self._inodes.forget(ino, count)

    async def lookup(self, parent_ino: int, name: str) -> Node:
        return await self._inodes.lookup(parent_ino, name)

    async def children(self, directory: Node) -> dict[str, Node]:
        """The entries of a directory, listed from the store on first use (and when stale)."""
        return await self._inodes.children(directory)

    def getattr(self, ino: int) -> Stat:
        return self.node(ino).stat()

    async def setattr(self, ino: int, *, mode: int | None = None, uid: int | None = None,
                      gid: int | None = None, size: int | None = None,
                      mtime_ns: int | None = None) -> Stat:
        node = self.node(ino)
        if size is not None:
            self._writer.check_size(node, size)
        async with node.lock:
            now = time.time_ns()
            if mode is not None:
                node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(mode)
            if uid is not None:
                node.uid = uid
            if gid is not None:
                node.gid = gid
            if mtime_ns is not None:
                node.mtime_ns = mtime_ns
            node.ctime_ns = now
            if size is not None:
                if node.kind != "file":
                    raise VfsError(errno.EISDIR if node.is_dir else errno.EINVAL)
                await self._writer.truncate(node, size)
                node.mtime_ns = now if mtime_ns is None else mtime_ns
            node.meta_dirty = True
            if not node.has_writer():
                await self._commits.commit_locked(node)  # truncate(1), chmod: durable when they return
                self._files.release_content(node)
            elif (mode, uid, gid) != (None, None, None):
                await self._commits.commit_attributes_locked(node)  # chmod, chown: durable now
            # A size or time change while the file is open for writing (ftruncate, the
            # kernel's truncate for O_TRUNC, the times it keeps under the writeback cache) is
            # part of the version being written, committed with it.
        return node.stat()

    def xattrs(self, ino: int) -> dict[str, bytes]:
        """``user.nvfs.*`` attributes of a file (:func:`nvfs.vfs.xattrs.storage_xattrs`)."""
        return storage_xattrs(self.node(ino), self.store.engine.name, self.config.chunk_size)

    def statfs(self) -> tuple[int, int] | None:
        return self.store.backend.capacity()

    # ----- namespace -------------------------------------------------------------------

    async def mkdir(self, parent_ino: int, name: str, mode: int, uid: int, gid: int) -> Node:
        return await self._namespace.mkdir(parent_ino, name, mode, uid, gid)

    async def symlink(self, parent_ino: int, name: str, target: str, uid: int, gid: int) -> Node:
        return await self._namespace.symlink(parent_ino, name, target, uid, gid)

    async def mknod(self, parent_ino: int, name: str, mode: int, rdev: int, uid: int, gid: int) -> Node:
        return await self._namespace.mknod(parent_ino, name, mode, rdev, uid, gid)

    def readlink(self, ino: int) -> str:
        return self._namespace.readlink(ino)

    async def unlink(self, parent_ino: int, name: str) -> None:
        await self._namespace.unlink(parent_ino, name)

    async def rmdir(self, parent_ino: int, name: str) -> None:
        await self._namespace.rmdir(parent_ino, name)

    async def rename(self, old_parent_ino: int, old_name: str, new_parent_ino: int, new_name: str,
                     *, noreplace: bool = False) -> None:
        await self._namespace.rename(old_parent_ino, old_name, new_parent_ino, new_name, noreplace=noreplace)

    # ----- open files ------------------------------------------------------------------

    def handle(self, fh: int) -> Handle:
        return self._files.handle(fh)

    async def open(self, ino: int, flags: int, *, sets_mtime: bool = True) -> int:
        node = self.node(ino)
        if node.kind != "file":
            raise VfsError(errno.EISDIR if node.is_dir else errno.EINVAL)
        writable = (flags & os.O_ACCMODE) != os.O_RDONLY
        fh = self._files.open_handle(node, writable, sets_mtime)
        if writable and flags & os.O_TRUNC:
            # The committed version stays in the store until this one is committed.
            async with node.lock:
                if node.size() > 0:
                    await self._writer.truncate(node, 0)
                node.mtime_ns = node.ctime_ns = time.time_ns()
                node.meta_dirty = True
        return fh

    async def create(self, parent_ino: int, name: str, mode: int, uid: int, gid: int, *,
                     sets_mtime: bool = True) -> tuple[int, Node]:
        node = await self._namespace.create_file(parent_ino, name, mode, uid, gid)
        return self._files.open_handle(node, writable=True, sets_mtime=sets_mtime), node

    async def read(self, fh: int, offset: int, length: int) -> bytes | memoryview:
        """The file's bytes at ``offset`` (:meth:`nvfs.vfs.reader.Reader.read`)."""
        return await self._reader.read(self.handle(fh), offset, length)

    async def write(self, fh: int, offset: int, data: bytes) -> int:
        return await self._writer.write(self.handle(fh), offset, data)

    async def flush(self, fh: int) -> None:
        """close(2) of one descriptor (:meth:`nvfs.vfs.commits.Committer.flush`)."""
        await self._commits.flush(fh)

    async def release(self, fh: int) -> None:
        """The kernel dropped an open file: commit once no handle can write the file any more."""
        await self._commits.release(fh)

    async def commit(self, node: Node) -> None:
        """Make the file's current contents durable and visible in the store (last release, fsync)."""
        await self._commits.commit(node)
