"""When a file's new version is committed: close, release, fsync and failed versions.

A version is committed -- its manifest written, which makes it durable and visible in the
store -- when the last handle that can write the file is released, on fsync, and at
unmount; never by FUSE ``flush``. The kernel sends ``flush`` on every close(2): of a
dup'ed descriptor, of the copy a forked child closes at exec, of the descriptor a shell
closes after setting up ``>``. Committing there would publish half-written files, and a
crash afterwards would leave them in place of the previous version. ``flush`` stores the
data written so far and reports a failure to store it, so that close(2) returns ENOSPC or
EIO, but it writes no manifest. ``release`` is sent once the kernel drops the open file,
after the last close(2) of every descriptor sharing it, and close(2) does not wait for it:
the commit follows close by moments (fsync waits for it).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import trio

from nvfs.store import Store
from nvfs.vfs.config import VfsConfig
from nvfs.vfs.content import FileContent
from nvfs.vfs.errors import VfsError, store_errno
from nvfs.vfs.garbage import GarbageCollector
from nvfs.vfs.handles import OpenFiles
from nvfs.vfs.inodes import Inodes
from nvfs.vfs.node import Node
from nvfs.vfs.workers import Workers
from nvfs.vfs.writer import Writer

log = logging.getLogger(__name__)


def _forget_nothing(ino: int, parent_ino: int | None, name: str) -> None:
    """Where no kernel caches the files (no FUSE adapter): nothing to forget."""


@dataclasses.dataclass(eq=False)
class Committer:
    """Close, release and commit of open files."""

    _store: Store
    _inodes: Inodes
    _files: OpenFiles
    _writer: Writer
    _garbage: GarbageCollector
    _workers: Workers
    _config: VfsConfig
    # Called (in a worker thread) with an inode, its parent directory's inode and its name,
    # when the kernel must forget what it cached of the file (data, attributes, the entry)
    # because the file went back to its committed version; the FUSE adapter sets it.
    invalidate_kernel_cache: Callable[[int, int | None, str], None] = dataclasses.field(
        default=_forget_nothing, init=False)
    _background_commits: int = dataclasses.field(default=0, init=False)  # of every file
    _background_commits_idle: trio.Event = dataclasses.field(default_factory=trio.Event, init=False)

    def __post_init__(self) -> None:
        self._background_commits_idle.set()

    async def wait_background_commits(self) -> None:
        """Return once no commit that ``async_close`` left running is running."""
        await self._background_commits_idle.wait()

    async def flush(self, fh: int) -> None:
        """close(2) of one descriptor: store what was written and report a failure; commit nothing.

        With ``async_close`` close returns at once and only reports a failure already known.
        """
        handle = self._files.handle(fh)
        node, content = handle.node, handle.node.content
        if not handle.writable or content is None:
            return
        if self._config.async_close:
            _raise_stored_error(content)
            return
        async with node.lock:
            await self._store_dirty(node, content)

    async def release(self, fh: int) -> None:
        """The kernel dropped an open file: commit once no handle can write the file any more."""
        handle = self._files.close_handle(fh)
        if handle is None:
            return
        node = handle.node
        if node.needs_commit() and not node.has_writer():
            if self._config.async_close:
                self._commit_in_background(node)
                return  # the commit lets go of the contents when it is done
            try:
                await self.commit(node)
            except VfsError as exc:
                log.error("%s: uncommitted data could not be stored: %s", node.display_path(), exc)
        self._let_go(node)

    def _let_go(self, node: Node) -> None:
        """The last handle is closed and no commit is running: revert a failed version, drop the contents.

        Readers still open keep reading the failed version, at the size the kernel holds for
        it, until they close: with the writeback cache the kernel keeps its own size of an
        open file and pads shorter replies with zeros, so the committed contents cannot be
        shown to them.
        """
        if node.open_count or node.background_commits:
            return
        if node.content is not None and node.content.error is not None:
            self._discard_failed_changes(node)
        self._files.release_content(node)

    def _commit_in_background(self, node: Node) -> None:
        if not node.needs_commit():
            return
        node.background_commits += 1
        if self._background_commits == 0:
            self._background_commits_idle = trio.Event()
        self._background_commits += 1
        self._workers.start_soon(self._background_commit, node)

    async def _background_commit(self, node: Node) -> None:
        """A commit nobody waits for: a failure can only be logged (the file keeps its old version)."""
        try:
            await self.commit(node)
        except VfsError as exc:
            log.error("%s: closed, but storing it failed: %s", node.display_path(), exc)
        finally:
            node.background_commits -= 1
            self._background_commits -= 1
            if self._background_commits == 0:
                self._background_commits_idle.set()
        self._let_go(node)

    def _discard_failed_changes(self, node: Node) -> None:
        """The store failed this file's data and its last writer is gone: fall back.

        The file returns to its last committed version (a file never committed leaves the
        tree), so the mount shows what the store holds and the file can be written again.
        The kernel is told to forget the failed version's pages, size and entry: it trusts
        its own size of a file under the writeback cache, and would pad the committed
        contents with zeros up to the failed size; once the entry is gone and no one holds
        the file open it drops the inode and looks the file up anew.
        """
        log.error("%s: discarding changes the store did not take; the file keeps its last "
                  "committed version", node.display_path())
        content = node.content
        assert content is not None
        content.dirty, content.error, content.orphaned = False, None, True
        node.meta_dirty = False
        parent_ino = node.parent.ino if node.parent is not None else None
        if node.manifest is None and node.parent is not None and not node.unlinked:
            self._inodes.detach(node.parent, node)
        elif node.manifest is not None:
            node.take_attributes(node.manifest)
        self._workers.start_soon(self._invalidate, node.ino, parent_ino, node.name)

    async def _invalidate(self, ino: int, parent_ino: int | None, name: str) -> None:
        # In a thread: the kernel may first write dirty pages of the file back to this
        # filesystem, whose requests the event loop serves.
        await trio.to_thread.run_sync(self.invalidate_kernel_cache, ino, parent_ino, name)

    async def commit(self, node: Node) -> None:
        """Make the file's current contents durable and visible in the store (last release, fsync)."""
        async with node.lock:
            await self.commit_locked(node)

    async def _store_dirty(self, node: Node, content: FileContent) -> None:
        """Store every dirty slot and wait for the uploads; raise the errno of a failed one."""
        for index in list(content.dirty_slots):
            if content.error is not None:
                break  # no point in storing more of a version that cannot be committed
            await self._writer.submit(node, index)
        if content.error is None:
            await content.wait_uploads()
        _raise_stored_error(content)

    async def commit_locked(self, node: Node) -> None:
        """:meth:`commit` for a caller that holds the node's lock."""
        if not node.needs_commit():
            return
        content = node.content
        if content is not None:
            await self._store_dirty(node, content)
        manifest = node.to_manifest()
        if manifest.kind == "file" and content is not None:
            manifest.engine = self._store.engine.name
        replaced = node.manifest
        await self._workers.run(self._store.write_entry, node.path(), manifest)
        if manifest.kind == "file":
            node.manifest = manifest
        node.changed_at = trio.current_time()
        if content is not None:
            content.dirty = False
        node.meta_dirty = False
        changed = replaced is not None and manifest.kind == "file" and replaced.chunks != manifest.chunks
        if changed or (content is not None and content.orphaned):
            self._garbage.request()
            if content is not None:
                content.orphaned = False
        log.debug("committed %s: %d bytes", node.display_path(), node.size())

    async def commit_attributes_locked(self, node: Node) -> None:
        """Store changed attributes (chmod, chown) with the committed contents, not the ones being written.

        A writer is still open: its version is unfinished and must not be committed, but the
        attribute change is durable when it returns, as for a file nobody writes.
        """
        committed = node.manifest
        if committed is None:
            return  # a file never committed: its first commit stores the attributes
        manifest = dataclasses.replace(committed, mode=node.mode, uid=node.uid, gid=node.gid,
                                       ctime_ns=node.ctime_ns)
        await self._workers.run(self._store.write_entry, node.path(), manifest)
        node.manifest = manifest
        if node.content is None or not node.content.dirty:
            node.meta_dirty = False


def _raise_stored_error(content: FileContent) -> None:
    """Raise the errno of this version's failed upload, if one failed."""
    if content.error is not None:
        raise VfsError(store_errno(content.error), f"storing data failed: {content.error}")
