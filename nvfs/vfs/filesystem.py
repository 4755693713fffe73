"""The virtual filesystem: inodes, open files, write buffers and read-ahead.

Everything here runs on the trio thread of the FUSE adapter. Handlers only touch memory
and hand blocking work (compression, storage I/O) to worker threads through
``trio.to_thread``; a full slot is stored in the background while the writer goes on,
and a writer waits only when ``max_inflight`` bytes are already on their way.

Semantics (docs/SEMANTICS.md): a file's new contents become durable and visible in
the store when the last handle that can write it is released, on fsync, or at unmount
(:mod:`nvfs.vfs.commits`); namespace operations (mkdir, rename, unlink, chmod, ...) are
durable when they return.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from nvfs.store import (
    DEFAULT_CHUNK_SIZE,
    ChunkCall,
    ChunkCorrupt,
    ChunkUnreadable,
    Manifest,
    Store,
    StoreUnavailable,
)
from nvfs.vfs.cache import ChunkCache, ChunkDropper
from nvfs.vfs.commits import Committing
from nvfs.vfs.content import FileContent, Slot, SlotBuffer
from nvfs.vfs.errors import VfsError, store_errno
from nvfs.vfs.names import (
    SPECIAL_TYPES,
    check_moved_tree,
    check_name_length,
    check_new_path,
    inherited,
    listed_below,
)
from nvfs.vfs.node import Node, Stat, locked

log = logging.getLogger(__name__)

ROOT_INO = 1
XATTR_PREFIX = "user.nvfs."
# How far from where a sequential reader's newest request ended the next may start and still
# continue the run. With the kernel's read-ahead at 4 MiB its requests came out of order, up to
# 10 MiB behind the newest (traced on 16 cores); taken for seeks, they kept the window at 3 fetches.
STRAGGLER_DISTANCE = 16 << 20
# Worker threads for namespace and metadata calls of the store (list, write and delete entries),
# apart from the ``threads`` that fetch and store chunks: with the store stalled, read-ahead
# fetches held every worker and ``ls`` of the mount waited behind them.
NAMESPACE_THREADS = 4


@dataclass
class VfsConfig:
    """Tunables of a mount (``-o`` options)."""

    chunk_size: int = DEFAULT_CHUNK_SIZE
    cache_size: int = 256 << 20
    max_inflight: int = 256 << 20
    max_dirty: int = 256 << 20
    readahead: int = 64 << 20
    threads: int = max(4, os.cpu_count() or 1)
    # Seconds a directory listing is trusted before the store is listed again, so that
    # files other mounts commit show up; None where this mount is the store's only user.
    metadata_ttl: float | None = None
    # close(2) returns before the data written is stored (it then reports only failures
    # already known); the commit at the last release runs in the background, and fsync and
    # unmount still wait for it.
    async_close: bool = False
    # Largest size a file may be given (write or truncate past it: EFBIG). Holes cost no
    # memory, but a manifest lists one entry per chunk up to its last stored chunk.
    max_file_size: int = 16 << 40


@dataclass
class Handle:
    """An open file: its node, how its writes count, and the state of its sequential-read detector."""

    node: Node
    writable: bool
    sets_mtime: bool = True  # False where the kernel keeps the mtime of what this handle writes
    next_offset: int = 0
    streak: int = 0  # bytes read since the last seek
    run_start: int = 0  # where the reader was when it last seeked
    ahead: int = 0  # first chunk index that read-ahead has not been asked for yet


class Vfs(Committing):
    """Inode table and file operations over a :class:`Store`."""

    def __init__(self, store: Store, config: VfsConfig) -> None:
        self.store = store
        self.config = config
        now = time.time_ns()
        root_meta = store.read_dir_meta(())
        root_meta.mtime_ns = root_meta.mtime_ns or now
        self.root = Node(ROOT_INO, None, "", root_meta, committed=True)
        self.root.lookups = 1
        self._nodes: dict[int, Node] = {ROOT_INO: self.root}
        self._next_ino = ROOT_INO + 1
        self._handles: dict[int, Handle] = {}
        self._next_fh = 1
        self._cache = ChunkCache(config.cache_size)
        self._fetching: dict[str, trio.Event] = {}
        self._workers = trio.CapacityLimiter(config.threads)  # chunk fetches, uploads, GC
        self._namespace = trio.CapacityLimiter(NAMESPACE_THREADS)
        self._inflight = trio.Semaphore(max(1, config.max_inflight // config.chunk_size))
        self._uploads = 0  # chunk uploads running, of every file, released ones included
        self._uploads_started = 0
        self._uploads_idle = trio.Event()
        self._uploads_idle.set()
        self._drained = trio.Event()  # set, and replaced, each time the last upload in flight ends
        self._background_commits = 0  # of every file
        self._background_commits_idle = trio.Event()
        self._background_commits_idle.set()
        self._gc_wanted = trio.Event()
        self._gc_requested = 0  # requests made; a pass serves every request made before it began
        self._gc_served = 0
        self._gc_pass_done = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._dropper: ChunkDropper | None = None

    # ----- lifecycle ----------------------------------------------------------------

    def start(self, nursery: trio.Nursery) -> None:
        """Run background work (uploads, read-ahead, garbage collection) in ``nursery``."""
        self._nursery = nursery
        self._dropper = ChunkDropper()
        nursery.start_soon(self._gc_loop)
        self._request_gc()  # clear out chunks orphaned by an earlier crash

    async def shutdown(self) -> None:
        """Commit whatever is still uncommitted (files left open at unmount) and drain."""
        await self._background_commits_idle.wait()
        for node in list(self._nodes.values()):
            if node.needs_commit():
                try:
                    await self.commit(node)
                except VfsError as exc:
                    log.error("%s: could not be committed at unmount: %s", node.display_path(), exc)
        await self._uploads_idle.wait()
        while self._gc_served < self._gc_requested:
            await self._gc_pass_done.wait()
        if self._dropper is not None:
            await trio.to_thread.run_sync(self._dropper.stop)

    async def uploads_drained(self) -> None:
        """Return the next time the last chunk upload in flight finishes: a burst of writes drained."""
        await self._drained.wait()

    def upload_count(self) -> int:
        """Chunk uploads started since the mount: it changes while anything is written."""
        return self._uploads_started

    # ----- inode table -----------------------------------------------------------------

    def node(self, ino: int) -> Node:
        try:
            return self._nodes[ino]
        except KeyError:
            raise VfsError(errno.ENOENT) from None

    def _new_node(self, parent: Node, name: str, meta: Manifest, committed: bool) -> Node:
        node = Node(self._next_ino, parent, name, meta, committed)
        node.set_type_bits()
        if not committed or meta.kind == "symlink":
            node.changed_at = trio.current_time()
        self._next_ino += 1
        self._nodes[node.ino] = node
        return node

    def remember(self, node: Node) -> None:
        """The kernel now holds one more reference to ``node`` (a lookup reply)."""
        node.lookups += 1

    def forget(self, ino: int, count: int) -> None:
        node = self._nodes.get(ino)
        if node is None or ino == ROOT_INO:
            return
        node.lookups = max(0, node.lookups - count)
        self._maybe_drop(node)

    def _maybe_drop(self, node: Node) -> None:
        """Drop an unlinked node once neither the kernel nor an open file refers to it."""
        if node.unlinked and node.lookups == 0 and node.open_count == 0:
            self._nodes.pop(node.ino, None)

    async def children(self, directory: Node) -> dict[str, Node]:
        """The entries of a directory, listed from the store on first use (and when stale)."""
        if not directory.is_dir:
            raise VfsError(errno.ENOTDIR)
        ttl = self.config.metadata_ttl
        started = trio.current_time()
        if directory.children is None or (ttl is not None and started - directory.listed_at > ttl):
            try:
                entries = await self._run(self.store.list_dir, directory.path())
            except VfsError:
                if directory.children is None:
                    raise
                directory.listed_at = started  # keep serving the last listing; retry after the TTL
                return directory.children
            if directory.children is None:
                directory.children = {
                    name: self._new_node(directory, name, meta, committed=True)
                    for name, meta in sorted(entries.items())
                }
            else:
                self._merge_listing(directory, entries, started)
            directory.listed_at = started
        return directory.children

    def _merge_listing(self, directory: Node, entries: dict[str, Manifest], started: float) -> None:
        """Take in what other mounts changed; local changes since the listing began win."""
        assert directory.children is not None
        for name, node in list(directory.children.items()):
            if node.changed_at >= started or node.is_busy():
                continue
            meta = entries.get(name)
            if meta is None or meta.kind != node.kind:
                if node.manifest is not None or node.kind != "file":
                    self._detach(directory, node, collect=False)
            elif meta.kind != "dir" and not self._unchanged(node, meta):
                node.take_attributes(meta)
        for name, meta in entries.items():
            if name not in directory.children:
                directory.children[name] = self._new_node(directory, name, meta, committed=True)

    async def lookup(self, parent_ino: int, name: str) -> Node:
        parent = self.node(parent_ino)
        if name == ".":
            return parent
        if name == "..":
            return parent.parent or parent
        check_name_length(name)
        node = (await self.children(parent)).get(name)
        if node is None:
            raise VfsError(errno.ENOENT)
        return node

    async def _run(self, fn, *args, lane: trio.CapacityLimiter | None = None):
        """Run blocking store work in a worker thread of ``lane`` (default: the namespace lane).

        A failing backend becomes EIO, or ENOSPC, EDQUOT or EFBIG where it said so.
        """
        try:
            return await trio.to_thread.run_sync(fn, *args, limiter=lane or self._namespace)
        except ChunkUnreadable:
            raise  # the reader reports it with the file and chunk
        except StoreUnavailable as exc:
            log.error("%s failed: %s", getattr(fn, "__name__", fn), exc)
            raise VfsError(store_errno(exc)) from None

    # ----- attributes -------------------------------------------------------------------

    def getattr(self, ino: int) -> Stat:
        return self.node(ino).stat()

    async def setattr(self, ino: int, *, mode: int | None = None, uid: int | None = None,
                      gid: int | None = None, size: int | None = None,
                      mtime_ns: int | None = None) -> Stat:
        node = self.node(ino)
        if size is not None:
            self._check_size(node, size)
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
                await self._truncate(node, size)
                node.mtime_ns = now if mtime_ns is None else mtime_ns
            node.meta_dirty = True
            if not self.has_writer(node):
                await self._commit_locked(node)  # truncate(1), chmod: durable when they return
                self._release_content(node)
            elif (mode, uid, gid) != (None, None, None):
                await self._commit_attributes_locked(node)  # chmod, chown: durable now
            # A size or time change while the file is open for writing (ftruncate, the
            # kernel's truncate for O_TRUNC, the times it keeps under the writeback cache) is
            # part of the version being written, committed with it.
        return node.stat()

    # ----- namespace -----------------------------------------------------------------

    async def _check_new_name(self, parent: Node, name: str, kind: str = "file") -> dict[str, Node]:
        check_new_path(self.store, (*parent.path(), name), kind)
        children = await self.children(parent)
        if name in children:
            raise VfsError(errno.EEXIST)
        return children

    async def _store_new_entry(self, parent: Node, children: dict[str, Node], name: str,
                               meta: Manifest) -> Node:
        """Store a new directory, symlink or node without contents durably, then show it."""
        await self._run(self.store.write_entry, (*parent.path(), name), meta)
        node = self._new_node(parent, name, meta, committed=meta.kind != "dir")
        node.changed_at = trio.current_time()
        children[name] = node
        parent.mtime_ns = parent.ctime_ns = meta.mtime_ns
        return node

    async def mkdir(self, parent_ino: int, name: str, mode: int, uid: int, gid: int) -> Node:
        parent = self.node(parent_ino)
        children = await self._check_new_name(parent, name, "dir")
        mode, gid = inherited(parent, stat.S_IFDIR | stat.S_IMODE(mode), gid, is_dir=True)
        now = time.time_ns()
        return await self._store_new_entry(parent, children, name, Manifest("dir", mode, uid, gid, now, now))

    async def symlink(self, parent_ino: int, name: str, target: str, uid: int, gid: int) -> Node:
        parent = self.node(parent_ino)
        children = await self._check_new_name(parent, name, "symlink")
        _, gid = inherited(parent, 0, gid, is_dir=False)
        now = time.time_ns()
        meta = Manifest("symlink", stat.S_IFLNK | 0o777, uid, gid, now, now, target=target)
        return await self._store_new_entry(parent, children, name, meta)

    async def mknod(self, parent_ino: int, name: str, mode: int, rdev: int, uid: int, gid: int) -> Node:
        """mknod(2), mkfifo(3), bind(2) of a unix socket: a node with attributes and no contents.

        A fifo, socket or device exists only in the namespace (the kernel serves opens of it
        without asking nvfs); a regular file made this way is an empty committed file.
        """
        kind = "file" if stat.S_ISREG(mode) else "special"
        if kind == "special" and stat.S_IFMT(mode) not in SPECIAL_TYPES:
            raise VfsError(errno.EINVAL)
        parent = self.node(parent_ino)
        children = await self._check_new_name(parent, name, kind)
        mode, gid = inherited(parent, stat.S_IFMT(mode) | stat.S_IMODE(mode), gid, is_dir=False)
        device = rdev if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else 0
        now = time.time_ns()
        meta = Manifest(kind, mode, uid, gid, now, now, rdev=device)
        return await self._store_new_entry(parent, children, name, meta)

    def readlink(self, ino: int) -> str:
        node = self.node(ino)
        if node.kind != "symlink":
            raise VfsError(errno.EINVAL)
        return node.target

    async def unlink(self, parent_ino: int, name: str) -> None:
        parent = self.node(parent_ino)
        node = (await self.children(parent)).get(name)
        if node is None:
            raise VfsError(errno.ENOENT)
        if node.is_dir:
            raise VfsError(errno.EISDIR)
        await self._remove(parent, node)

    async def rmdir(self, parent_ino: int, name: str) -> None:
        parent = self.node(parent_ino)
        node = (await self.children(parent)).get(name)
        if node is None:
            raise VfsError(errno.ENOENT)
        if not node.is_dir:
            raise VfsError(errno.ENOTDIR)
        if await self.children(node):
            raise VfsError(errno.ENOTEMPTY)
        await self._remove(parent, node)

    async def _remove(self, parent: Node, node: Node) -> None:
        """Take ``node`` out of the namespace, durably; open files keep their contents.

        Under the node's lock: a commit in flight finishes first (and its manifest is deleted
        here); one that begins later finds the node unlinked and stores nothing.
        """
        async with node.lock:
            if node.unlinked or node.parent is not parent:
                raise VfsError(errno.ENOENT)  # a concurrent unlink or rename came first
            if node.is_dir or node.kind == "symlink" or node.manifest is not None:
                await self._run(self.store.delete_entry, node.path(), node.kind)
            self._detach(parent, node)

    @staticmethod
    def _unchanged(node: Node, meta: Manifest) -> bool:
        """Whether a listed manifest says what the node already holds.

        The store hands back the same manifest object while its version is unchanged, so
        the usual answer costs an identity check, not a comparison of every chunk.
        """
        if node.kind == "file":
            return meta is node.manifest or meta == node.manifest
        return (meta.mode, meta.uid, meta.gid, meta.mtime_ns, meta.target) == (
            node.mode, node.uid, node.gid, node.mtime_ns, node.target)

    def _detach(self, parent: Node, node: Node, *, collect: bool = True) -> None:
        """Take ``node`` out of the tree; ``collect`` when this freed chunks in the store."""
        assert parent.children is not None
        del parent.children[node.name]
        parent.mtime_ns = parent.ctime_ns = time.time_ns()
        had_chunks = node.manifest is not None and any(node.manifest.chunks)
        node.unlinked = True
        node.parent = None
        node.manifest = None
        if had_chunks and collect:
            self._request_gc()
        if node.content is None:
            self._maybe_drop(node)

    async def rename(self, old_parent_ino: int, old_name: str, new_parent_ino: int, new_name: str,
                     *, noreplace: bool = False) -> None:
        old_parent, new_parent = self.node(old_parent_ino), self.node(new_parent_ino)
        while True:
            node, target = await self._rename_operands(old_parent, old_name, new_parent, new_name, noreplace)
            if target is node:
                return
            # A commit stores a file's manifest under the path the file had when it began:
            # holding the locks of both files, and of the files below a directory that have
            # something to commit, keeps their paths still until it has finished.
            async with locked(node, target, *(below for below in listed_below(node) if below.is_busy())):
                if (old_parent.children or {}).get(old_name) is node and \
                        (new_parent.children or {}).get(new_name) is target:
                    await self._move(node, target, new_parent, new_name)
                    break
            # Another request changed either name while this one waited: look again.
        now = time.time_ns()
        node.ctime_ns = now
        for parent in dict.fromkeys((old_parent, new_parent)):
            parent.mtime_ns = parent.ctime_ns = now
            await self._store_directory_times(parent)

    async def _rename_operands(self, old_parent: Node, old_name: str, new_parent: Node, new_name: str,
                               noreplace: bool) -> tuple[Node, Node | None]:
        """The entry to move and the one it replaces, once the rename is known to be allowed."""
        check_name_length(old_name)
        node = (await self.children(old_parent)).get(old_name)
        if node is None:
            raise VfsError(errno.ENOENT)
        check_moved_tree(self.store, node, (*new_parent.path(), new_name))
        target = (await self.children(new_parent)).get(new_name)
        if target is not node:
            self._check_rename(node, new_parent, target, noreplace)
            if target is not None and target.is_dir and await self.children(target):
                raise VfsError(errno.ENOTEMPTY)
        return node, target

    async def _move(self, node: Node, target: Node | None, new_parent: Node, new_name: str) -> None:
        """Move ``node`` to ``new_name`` in ``new_parent``, in the store and then in the tree."""
        old_parent = node.parent
        assert old_parent is not None and old_parent.children is not None and new_parent.children is not None
        old_path, new_path = node.path(), (*new_parent.path(), new_name)
        if node.is_dir or node.kind == "symlink" or node.manifest is not None:
            await self._run(self.store.rename_entry, old_path, new_path, node.kind)
        elif target is not None and (target.kind == "symlink" or target.manifest is not None):
            await self._run(self.store.delete_entry, new_path, target.kind)
        if target is not None:
            self._detach(new_parent, target)
        del old_parent.children[node.name]
        node.parent, node.name = new_parent, new_name
        node.changed_at = trio.current_time()
        new_parent.children[new_name] = node

    async def _store_directory_times(self, directory: Node) -> None:
        """Persist a directory's attributes (its marker) after a rename changed its times.

        The rename itself is already durable: a failure here is logged, not reported.
        """
        try:
            await self._run(self.store.write_entry, directory.path(), directory.to_manifest())
        except VfsError as exc:
            log.error("%s: times after a rename not stored: %s", directory.display_path(), exc)

    @staticmethod
    def _check_rename(node: Node, new_parent: Node, target: Node | None, noreplace: bool) -> None:
        if target is not None:
            if noreplace:
                raise VfsError(errno.EEXIST)
            if node.is_dir and not target.is_dir:
                raise VfsError(errno.ENOTDIR)
            if target.is_dir and not node.is_dir:
                raise VfsError(errno.EISDIR)
        ancestor: Node | None = new_parent
        while ancestor is not None:
            if ancestor is node:
                raise VfsError(errno.EINVAL)  # a directory cannot move into itself
            ancestor = ancestor.parent

    # ----- open files --------------------------------------------------------------------

    def _ensure_content(self, node: Node) -> FileContent:
        if node.content is None:
            manifest = node.manifest
            if manifest is not None:
                content = FileContent(manifest.chunk_size or self.config.chunk_size, manifest.size,
                                      list(manifest.chunks), self.store.layout_tracker())
            else:
                content = FileContent(self.config.chunk_size, 0, [], self.store.layout_tracker())
                content.dirty = True  # a new file: its first commit creates it
            self.store.pin(content.pinned_ids())
            node.content = content
        return node.content

    def _release_content(self, node: Node) -> None:
        content = node.content
        if content is None or node.open_count > 0:
            return
        if content.dirty and not node.unlinked:
            return  # uncommitted data stays until a commit succeeds or the mount ends
        held = content.pinned_ids()
        self.store.unpin(held)
        committed = {ref.id for ref in node.manifest.chunks if ref} if node.manifest else set()
        if content.orphaned or not committed.issuperset(held):
            self._request_gc()  # chunks stored for data that no manifest will name
        for slot in content.slots.values():
            slot.version += 1
        node.content = None
        self._maybe_drop(node)

    def _open_handle(self, node: Node, writable: bool, sets_mtime: bool) -> int:
        self._ensure_content(node)
        node.open_count += 1
        node.writers += writable
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = Handle(node, writable, sets_mtime)
        return fh

    def handle(self, fh: int) -> Handle:
        try:
            return self._handles[fh]
        except KeyError:
            raise VfsError(errno.EBADF) from None

    async def open(self, ino: int, flags: int, *, sets_mtime: bool = True) -> int:
        node = self.node(ino)
        if node.kind != "file":
            raise VfsError(errno.EISDIR if node.is_dir else errno.EINVAL)
        writable = (flags & os.O_ACCMODE) != os.O_RDONLY
        fh = self._open_handle(node, writable, sets_mtime)
        if writable and flags & os.O_TRUNC:
            # The committed version stays in the store until this one is committed.
            async with node.lock:
                if node.size() > 0:
                    await self._truncate(node, 0)
                node.mtime_ns = node.ctime_ns = time.time_ns()
                node.meta_dirty = True
        return fh

    async def create(self, parent_ino: int, name: str, mode: int, uid: int, gid: int, *,
                     sets_mtime: bool = True) -> tuple[int, Node]:
        parent = self.node(parent_ino)
        children = await self._check_new_name(parent, name)
        mode, gid = inherited(parent, stat.S_IFREG | stat.S_IMODE(mode), gid, is_dir=False)
        now = time.time_ns()
        meta = Manifest("file", mode, uid, gid, now, now)
        node = self._new_node(parent, name, meta, committed=False)
        children[name] = node
        parent.mtime_ns = parent.ctime_ns = now
        return self._open_handle(node, writable=True, sets_mtime=sets_mtime), node

    # ----- writing ----------------------------------------------------------------------

    async def write(self, fh: int, offset: int, data: bytes) -> int:
        handle = self.handle(fh)
        if not handle.writable:
            raise VfsError(errno.EBADF)
        node = handle.node
        async with node.lock:
            content = self._ensure_content(node)
            if content.error is not None:
                raise VfsError(store_errno(content.error), f"an earlier write failed: {content.error}")
            if offset + len(data) > self.config.max_file_size:
                raise VfsError(errno.EFBIG, f"a write to {offset + len(data)} bytes is past max_file_size")
            await self._write_locked(node, content, offset, memoryview(data))
            if handle.sets_mtime:
                node.mtime_ns = node.ctime_ns = time.time_ns()
        return len(data)

    async def _write_locked(self, node: Node, content: FileContent, offset: int, data: memoryview) -> None:
        size = content.chunk_size
        content.grow(offset + len(data))
        content.dirty = True
        done = 0
        while done < len(data):
            position = offset + done
            index, start = divmod(position, size)
            count = min(size - start, len(data) - done)
            buffer = await self._writable_buffer(node, content, index, start, count)
            buffer.write(start, data[done : done + count])
            if start + count == size:
                await self._submit(node, index)
            done += count
        while len(content.dirty_slots) * size > self.config.max_dirty:
            await self._submit(node, next(iter(content.dirty_slots)))

    async def _writable_buffer(self, node: Node, content: FileContent, index: int, start: int,
                               count: int) -> SlotBuffer:
        """The dirty buffer of a slot, made from its current data if it has none yet."""
        slot = content.slot(index)
        if slot.buffer is not None:
            return slot.buffer
        if slot.frozen is not None:
            base: bytes | memoryview = slot.frozen
        elif slot.ref is not None and not (start == 0 and count >= slot.ref.length):
            base = await self._chunk_bytes(node, index, slot)
        else:
            base = b""
        self._replace_ref(content, slot, None)
        slot.buffer = SlotBuffer(content.chunk_size, base[: content.slot_length(index)], start + count,
                                 self.store.chunk_buffer)
        slot.frozen = None
        slot.version += 1
        content.dirty_slots[index] = None
        return slot.buffer

    def _replace_ref(self, content: FileContent, slot: Slot, ref) -> None:
        if slot.ref is not None:
            self.store.unpin([slot.ref.id])
            content.orphaned = True
        slot.ref = ref

    async def _submit(self, node: Node, index: int) -> None:
        """Freeze a dirty slot and store it in the background (waits if too much is in flight)."""
        content = node.content
        assert content is not None and self._nursery is not None
        slot = content.slots.get(index)
        if slot is None or slot.buffer is None:
            return
        data = slot.buffer.view()  # frozen from here on: a later write to the slot starts a new buffer
        slot.buffer, slot.frozen = None, data
        slot.version += 1
        content.dirty_slots.pop(index, None)
        regions = content.layout.chunk_regions(index * content.chunk_size, data)
        await self._acquire_inflight(content)
        content.begin_upload()
        if self._uploads == 0:
            self._uploads_idle = trio.Event()
        self._uploads += 1
        self._uploads_started += 1
        self._nursery.start_soon(self._upload, node, content, index, slot, slot.version, data, regions)

    async def _acquire_inflight(self, content: FileContent) -> None:
        """Wait for room among the bytes in flight, but give up once this file's data failed.

        A failing store can hold every slot for a minute of retries; the writer should hear
        about the failure, not wait behind it.
        """
        while True:
            if content.error is not None:
                raise VfsError(store_errno(content.error), f"storing data failed: {content.error}")
            with trio.move_on_after(0.5):
                await self._inflight.acquire()
                return

    async def _upload(self, node: Node, content: FileContent, index: int, slot: Slot, version: int,
                      data: bytearray, regions) -> None:
        try:
            # Not once an earlier chunk of this version failed: it will not be committed.
            ref = await self._complete(self.store.start_put(data, regions), lambda: content.error is None)
            if ref is None:
                return
        except Exception as exc:  # surfaces as EIO on the next write, fsync or close
            log.error("%s: storing chunk %d failed: %s", node.display_path(), index, exc)
            content.error = exc
        else:
            if slot.version == version:
                self._replace_ref(content, slot, ref)
                slot.frozen = None
            else:
                self.store.unpin([ref.id])  # overwritten or truncated while it was stored
                content.orphaned = True
                if node.content is not content:
                    self._request_gc()  # the file let go of this content before the chunk landed
        finally:
            self._inflight.release()
            content.end_upload()
            self._uploads -= 1
            if self._uploads == 0:
                self._uploads_idle.set()
                self._drained.set()
                self._drained = trio.Event()

    def _check_size(self, node: Node, size: int) -> None:
        """Refuse a negative size, and growing a file past ``max_file_size`` (EFBIG)."""
        if size < 0:
            raise VfsError(errno.EINVAL)
        if size > max(self.config.max_file_size, node.size()):
            raise VfsError(errno.EFBIG, f"{size} bytes is more than max_file_size")

    async def _truncate(self, node: Node, size: int) -> None:
        self._check_size(node, size)
        content = self._ensure_content(node)
        content.dirty = True
        if size == 0:
            content.layout = self.store.layout_tracker()  # rewritten from scratch: learn anew
        if size >= content.size:
            content.grow(size)
            return
        for dropped in content.shrink(size):
            self._replace_ref(content, dropped, None)
        index, keep = divmod(size, content.chunk_size)
        if keep and index in content.slots:
            buffer = await self._writable_buffer(node, content, index, 0, 0)
            buffer.truncate(keep)

    # ----- reading ------------------------------------------------------------------------

    async def read(self, fh: int, offset: int, length: int) -> bytes | memoryview:
        """The file's bytes at ``offset``; zero-copy where one stored chunk holds them all.

        A view into a decoded chunk is safe to hand out: cached chunks are never changed,
        and the FUSE adapter copies the reply to the kernel before anything else runs.
        """
        handle = self.handle(fh)
        node = handle.node
        content = self._ensure_content(node)
        end = min(offset + length, content.size)
        if offset >= end:
            return b""
        # Before waiting for this read's chunks: the kernel sends a sequential reader's
        # requests several at a time, and they finish in any order.
        self._read_ahead(handle, content, offset, end)
        chunk = content.chunk_size
        pieces: list[bytes | memoryview] = []
        position = offset
        while position < end:
            index, start = divmod(position, chunk)
            count = min(chunk - start, end - position)
            data = await self._slot_bytes(node, content, index)
            if isinstance(data, SlotBuffer):
                piece = memoryview(bytes(data.view()[start : start + count]))  # later writes change it
            else:
                piece = memoryview(data)[start : start + count]
            pieces.append(piece)
            if len(piece) < count:
                pieces.append(bytes(count - len(piece)))
            position += count
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def _slot_bytes(self, node: Node, content: FileContent, index: int
                          ) -> bytes | memoryview | SlotBuffer:
        slot = content.slots.get(index) or Slot()
        if slot.buffer is not None:
            return slot.buffer
        if slot.frozen is not None:
            return slot.frozen
        if slot.ref is None:
            return b""
        return await self._chunk_bytes(node, index, slot)

    async def _chunk_bytes(self, node: Node, index: int, slot: Slot) -> bytes:
        ref = slot.ref
        assert ref is not None
        try:
            return await self._fetch(ref)
        except ChunkCorrupt as exc:
            log.error("%s: chunk %d (%s) failed verification: %s", node.display_path(), index, ref.id, exc)
            raise VfsError(errno.EIO) from None
        except (ChunkUnreadable, OSError) as exc:
            log.error("%s: chunk %d (%s) could not be read: %s", node.display_path(), index, ref.id, exc)
            raise VfsError(errno.EIO) from None

    async def _fetch(self, ref) -> bytes:
        """Decoded chunk bytes from the cache, a fetch already under way, or the store."""
        while True:
            data = self._cache.get(ref.id)
            if data is not None:
                return data
            pending = self._fetching.get(ref.id)
            if pending is None:
                break
            await pending.wait()  # then look again: that fetch may have failed or been evicted
        done = self._fetching[ref.id] = trio.Event()
        try:
            data = await self._complete(self.store.start_get(ref))
            evicted = self._cache.put(ref.id, data)
            if evicted:
                assert self._dropper is not None
                self._dropper.drop(evicted)
            return data
        finally:
            if self._fetching.get(ref.id) is done:
                del self._fetching[ref.id]
            done.set()

    async def _complete(self, call: ChunkCall, wanted: Callable[[], bool] = lambda: True):
        """The result of a chunk call (store or fetch): from a chunk process or a worker thread.

        While a chunk process has the call, this task waits for it on the event loop and holds
        a worker slot, as a worker thread would hold one, so that a lane of the chunk processes
        is free whenever a slot is. ``wanted`` is asked before the work starts, either way:
        ``None`` where it says no.
        """
        if call.may_send and wanted():
            async with self._workers:
                if call.send():
                    with trio.CancelScope(shield=True):  # the process has the chunk: its answer must be read
                        with trio.move_on_after(call.timeout) as waiting:
                            await trio.lowlevel.wait_readable(call.fileno())
                        result = call.receive(answered=not waiting.cancelled_caught)
                    if result is not None:
                        return result

        def chunk_call_here():
            return call.finish() if wanted() else None

        return await self._run(chunk_call_here, lane=self._workers)

    def _read_ahead(self, handle: Handle, content: FileContent, offset: int, end: int) -> None:
        """Fetch the chunks after a sequential reader's position before it asks for them.

        The window is half of what the reader has asked for since its last seek, up to
        ``readahead`` bytes: a reader of one tensor (``safe_open``, an mmap) fetches little
        beyond the tensor. A run that began at the start of the file and has read a whole
        chunk is a copy or a restore (``cat``, ``cp``, ``torch.load``): its window is twice
        what it has read, so that it reaches ``readahead`` after 32 MiB rather than 128, the
        part of a cold restore in which the reader waited for chunks (512 MiB read as four
        1 MiB requests at a time, chunk fetches taking 25 ms: 0.39-0.41 s instead of
        0.49-0.53 s). A jump farther than
        ``STRAGGLER_DISTANCE`` (or a chunk) starts over; a reader skipping a zip header stays
        sequential, and so do requests the kernel sends a little out of order.
        Called as a read arrives: judged as they finished, concurrent requests looked like seeks.
        """
        chunk = content.chunk_size
        if abs(offset - handle.next_offset) <= max(chunk, STRAGGLER_DISTANCE):
            handle.streak += end - offset
            handle.next_offset = max(handle.next_offset, end)
        else:
            handle.streak, handle.ahead, handle.next_offset = end - offset, 0, end
            handle.run_start = offset
        from_start = handle.run_start == 0 and handle.streak >= chunk
        window = min(2 * handle.streak if from_start else handle.streak // 2, self.config.readahead) // chunk
        assert self._nursery is not None
        first = (end - 1) // chunk + 1
        last = min(first + window, content.slot_count())
        start, handle.ahead = max(first, handle.ahead), max(handle.ahead, last)
        for index in range(start, last):  # only chunks no earlier read of this run asked for
            slot = content.slots.get(index)
            ref = slot.ref if slot is not None else None
            if ref is not None and ref.id not in self._cache and ref.id not in self._fetching:
                self._nursery.start_soon(self._prefetch, ref)

    async def _prefetch(self, ref) -> None:
        try:
            await self._fetch(ref)
        except Exception as exc:  # read-ahead is a guess: the read itself reports failures
            log.debug("read-ahead of chunk %s failed: %s", ref.id, exc)

    # ----- store-wide -----------------------------------------------------------------------

    def statfs(self) -> tuple[int, int] | None:
        return self.store.backend.capacity()

    def xattrs(self, ino: int) -> dict[str, bytes]:
        """``user.nvfs.*`` attributes: stored size, ratio and codec of a file.

        They describe the contents this mount shows, as far as they are stored: right after
        close(2), before the commit that follows it, they are already those of the new version.
        """
        node = self.node(ino)
        if node.kind != "file":
            return {}
        logical, stored = node.size(), node.stored_size()
        manifest = node.manifest
        if node.content is not None:
            manifest = node.to_manifest()
            manifest.engine = self.store.engine.name
        pending = node.content is not None and node.content.dirty
        values = {
            "logical_size": str(logical),
            "stored_size": str(stored),
            "ratio": f"{logical / stored:.4f}" if stored else "inf" if logical else "1.0000",
            "codec": manifest.codecs() if manifest else "none",
            "engine": (manifest.engine or "cpu") if manifest else "none",
            "chunks": str(len(manifest.chunks)) if manifest else "0",
            "chunk_size": str(manifest.chunk_size if manifest else self.config.chunk_size),
            "committed": "no" if pending or node.manifest is None else "yes",
        }
        return {XATTR_PREFIX + key: value.encode() for key, value in values.items()}

    def _request_gc(self) -> None:
        self._gc_requested += 1
        self._gc_wanted.set()

    async def _gc_loop(self) -> None:
        """Delete unreferenced chunks in the background, one pass per burst of requests."""
        while True:
            await self._gc_wanted.wait()
            self._gc_wanted = trio.Event()
            requested = self._gc_requested
            try:
                await self._run(self.store.collect_garbage, lane=self._workers)
            except Exception as exc:
                log.error("garbage collection failed (nothing was deleted): %s", exc)
            finally:
                self._gc_served = requested
                self._gc_pass_done.set()
                self._gc_pass_done = trio.Event()
