"""The inode table: nodes by number, directory listings from the store, and taking nodes out of the tree."""

from __future__ import annotations

import errno
import time

import trio

from nvfs.store import Manifest, Store
from nvfs.vfs.config import VfsConfig
from nvfs.vfs.errors import VfsError
from nvfs.vfs.garbage import GarbageCollector
from nvfs.vfs.names import check_name_length
from nvfs.vfs.node import Node
from nvfs.vfs.workers import Workers

ROOT_INO = 1


class Inodes:
    """Every node the kernel or an open file may refer to, loaded from the store one directory at a time."""

    def __init__(self, store: Store, workers: Workers, garbage: GarbageCollector, config: VfsConfig) -> None:
        self._store = store
        self._workers = workers
        self._garbage = garbage
        self._config = config
        root_meta = store.read_dir_meta(())
        root_meta.mtime_ns = root_meta.mtime_ns or time.time_ns()
        self.root = Node(ROOT_INO, None, "", root_meta, committed=True)
        self.root.lookups = 1
        self._nodes: dict[int, Node] = {ROOT_INO: self.root}
        self._next_ino = ROOT_INO + 1

    def node(self, ino: int) -> Node:
        try:
            return self._nodes[ino]
        except KeyError:
            raise VfsError(errno.ENOENT) from None

    def all(self) -> list[Node]:
        """A snapshot of every node in the table."""
        return list(self._nodes.values())

    def new_node(self, parent: Node, name: str, meta: Manifest, committed: bool) -> Node:
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
        self.drop_if_unused(node)

    def drop_if_unused(self, node: Node) -> None:
        """Drop an unlinked node once neither the kernel nor an open file refers to it."""
        if node.unlinked and node.lookups == 0 and node.open_count == 0:
            self._nodes.pop(node.ino, None)

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

    async def children(self, directory: Node) -> dict[str, Node]:
        """The entries of a directory, listed from the store on first use (and when stale)."""
        if not directory.is_dir:
            raise VfsError(errno.ENOTDIR)
        ttl = self._config.metadata_ttl
        started = trio.current_time()
        if directory.children is None or (ttl is not None and started - directory.listed_at > ttl):
            try:
                entries = await self._workers.run(self._store.list_dir, directory.path())
            except VfsError:
                if directory.children is None:
                    raise
                directory.listed_at = started  # keep serving the last listing; retry after the TTL
                return directory.children
            if directory.children is None:
                directory.children = {
                    name: self.new_node(directory, name, meta, committed=True)
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
                    self.detach(directory, node, collect=False)
            elif meta.kind != "dir" and not _unchanged(node, meta):
                node.take_attributes(meta)
        for name, meta in entries.items():
            if name not in directory.children:
                directory.children[name] = self.new_node(directory, name, meta, committed=True)

    def detach(self, parent: Node, node: Node, *, collect: bool = True) -> None:
        """Take ``node`` out of the tree; ``collect`` when this freed chunks in the store."""
        assert parent.children is not None
        del parent.children[node.name]
        parent.mtime_ns = parent.ctime_ns = time.time_ns()
        had_chunks = node.manifest is not None and any(node.manifest.chunks)
        node.unlinked = True
        node.parent = None
        node.manifest = None
        if had_chunks and collect:
            self._garbage.request()
        if node.content is None:
            self.drop_if_unused(node)


def _unchanged(node: Node, meta: Manifest) -> bool:
    """Whether a listed manifest says what the node already holds.

    The store hands back the same manifest object while its version is unchanged, so
    the usual answer costs an identity check, not a comparison of every chunk.
    """
    if node.kind == "file":
        return meta is node.manifest or meta == node.manifest
    return (meta.mode, meta.uid, meta.gid, meta.mtime_ns, meta.target) == (
        node.mode, node.uid, node.gid, node.mtime_ns, node.target)
