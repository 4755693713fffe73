"""Namespace operations: making, removing and renaming entries, each durable in the store when it returns."""

from __future__ import annotations

import errno
import logging
import stat
import time

import trio

from nvfs.store import Manifest, Store
from nvfs.vfs.errors import VfsError
from nvfs.vfs.inodes import Inodes
from nvfs.vfs.names import (
    SPECIAL_TYPES,
    check_moved_tree,
    check_name_length,
    check_new_path,
    inherited,
    listed_below,
)
from nvfs.vfs.node import Node, locked
from nvfs.vfs.workers import Workers

log = logging.getLogger(__name__)


class Namespace:
    """mkdir, symlink, mknod, create, unlink, rmdir and rename over the inode table and the store."""

    def __init__(self, store: Store, inodes: Inodes, workers: Workers) -> None:
        self._store = store
        self._inodes = inodes
        self._workers = workers

    async def _check_new_name(self, parent: Node, name: str, kind: str = "file") -> dict[str, Node]:
        """The parent's entries, once ``name`` is known to be free and storable there."""
        check_new_path(self._store, (*parent.path(), name), kind)
        children = await self._inodes.children(parent)
        if name in children:
            raise VfsError(errno.EEXIST)
        return children

    async def _store_new_entry(self, parent: Node, children: dict[str, Node], name: str,
                               meta: Manifest) -> Node:
        """Store a new directory, symlink or node without contents durably, then show it."""
        await self._workers.run(self._store.write_entry, (*parent.path(), name), meta)
        node = self._inodes.new_node(parent, name, meta, committed=meta.kind != "dir")
        node.changed_at = trio.current_time()
        children[name] = node
        parent.mtime_ns = parent.ctime_ns = meta.mtime_ns
        return node

    async def mkdir(self, parent_ino: int, name: str, mode: int, uid: int, gid: int) -> Node:
        parent = self._inodes.node(parent_ino)
        children = await self._check_new_name(parent, name, "dir")
        mode, gid = inherited(parent, stat.S_IFDIR | stat.S_IMODE(mode), gid, is_dir=True)
        now = time.time_ns()
        return await self._store_new_entry(parent, children, name, Manifest("dir", mode, uid, gid, now, now))

    async def symlink(self, parent_ino: int, name: str, target: str, uid: int, gid: int) -> Node:
        parent = self._inodes.node(parent_ino)
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
        parent = self._inodes.node(parent_ino)
        children = await self._check_new_name(parent, name, kind)
        mode, gid = inherited(parent, stat.S_IFMT(mode) | stat.S_IMODE(mode), gid, is_dir=False)
        device = rdev if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else 0
        now = time.time_ns()
        meta = Manifest(kind, mode, uid, gid, now, now, rdev=device)
        return await self._store_new_entry(parent, children, name, meta)

    async def create_file(self, parent_ino: int, name: str, mode: int, uid: int, gid: int) -> Node:
        """A new, empty file in the tree; the store holds nothing of it until its first commit."""
        parent = self._inodes.node(parent_ino)
        children = await self._check_new_name(parent, name)
        mode, gid = inherited(parent, stat.S_IFREG | stat.S_IMODE(mode), gid, is_dir=False)
        now = time.time_ns()
        meta = Manifest("file", mode, uid, gid, now, now)
        node = self._inodes.new_node(parent, name, meta, committed=False)
        children[name] = node
        parent.mtime_ns = parent.ctime_ns = now
        return node

    def readlink(self, ino: int) -> str:
        node = self._inodes.node(ino)
        if node.kind != "symlink":
            raise VfsError(errno.EINVAL)
        return node.target

    async def unlink(self, parent_ino: int, name: str) -> None:
        parent = self._inodes.node(parent_ino)
        node = (await self._inodes.children(parent)).get(name)
        if node is None:
            raise VfsError(errno.ENOENT)
        if node.is_dir:
            raise VfsError(errno.EISDIR)
        await self._remove(parent, node)

    async def rmdir(self, parent_ino: int, name: str) -> None:
        parent = self._inodes.node(parent_ino)
        node = (await self._inodes.children(parent)).get(name)
        if node is None:
            raise VfsError(errno.ENOENT)
        if not node.is_dir:
            raise VfsError(errno.ENOTDIR)
        if await self._inodes.children(node):
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
                await self._workers.run(self._store.delete_entry, node.path(), node.kind)
            self._inodes.detach(parent, node)

    async def rename(self, old_parent_ino: int, old_name: str, new_parent_ino: int, new_name: str,
                     *, noreplace: bool = False) -> None:
        old_parent, new_parent = self._inodes.node(old_parent_ino), self._inodes.node(new_parent_ino)
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
        node = (await self._inodes.children(old_parent)).get(old_name)
        if node is None:
            raise VfsError(errno.ENOENT)
        check_moved_tree(self._store, node, (*new_parent.path(), new_name))
        target = (await self._inodes.children(new_parent)).get(new_name)
        if target is not node:
            _check_rename(node, new_parent, target, noreplace)
            if target is not None and target.is_dir and await self._inodes.children(target):
                raise VfsError(errno.ENOTEMPTY)
        return node, target

    async def _move(self, node: Node, target: Node | None, new_parent: Node, new_name: str) -> None:
        """Move ``node`` to ``new_name`` in ``new_parent``, in the store and then in the tree."""
        old_parent = node.parent
        assert old_parent is not None and old_parent.children is not None and new_parent.children is not None
        old_path, new_path = node.path(), (*new_parent.path(), new_name)
        if node.is_dir or node.kind == "symlink" or node.manifest is not None:
            await self._workers.run(self._store.rename_entry, old_path, new_path, node.kind)
        elif target is not None and (target.kind == "symlink" or target.manifest is not None):
            await self._workers.run(self._store.delete_entry, new_path, target.kind)
        if target is not None:
            self._inodes.detach(new_parent, target)
        del old_parent.children[node.name]
        node.parent, node.name = new_parent, new_name
        node.changed_at = trio.current_time()
        new_parent.children[new_name] = node

    async def _store_directory_times(self, directory: Node) -> None:
        """Persist a directory's attributes (its marker) after a rename changed its times.

        The rename itself is already durable: a failure here is logged, not reported.
        """
        try:
            await self._workers.run(self._store.write_entry, directory.path(), directory.to_manifest())
        except VfsError as exc:
            log.error("%s: times after a rename not stored: %s", directory.display_path(), exc)


def _check_rename(node: Node, new_parent: Node, target: Node | None, noreplace: bool) -> None:
    """EEXIST, ENOTDIR, EISDIR or EINVAL where POSIX forbids moving ``node`` onto ``target``."""
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
