"""Inodes: the in-memory namespace, loaded from the store one directory at a time."""

from __future__ import annotations

import contextlib
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass

import trio

from nvfs.store import Manifest
from nvfs.vfs.content import FileContent


@dataclass
class Stat:
    """What ``stat(2)`` reports for a node."""

    ino: int
    mode: int
    nlink: int
    uid: int
    gid: int
    size: int
    blocks: int
    mtime_ns: int
    ctime_ns: int
    rdev: int = 0


class Node:
    """A file, directory, symlink or special file (fifo, socket, device: attributes only).

    ``manifest`` is the last committed version of a file or special file (``None`` until
    the first commit); ``content`` exists while the file is open or holds uncommitted data.
    ``children`` of a directory is ``None`` until the directory is first listed.
    """

    def __init__(self, ino: int, parent: Node | None, name: str, meta: Manifest, committed: bool) -> None:
        self.ino = ino
        self.parent = parent
        self.name = name
        self.kind = meta.kind
        self.mode = meta.mode
        self.uid = meta.uid
        self.gid = meta.gid
        self.mtime_ns = meta.mtime_ns
        self.ctime_ns = meta.ctime_ns
        self.target = meta.target
        self.rdev = meta.rdev
        # A special file's manifest is kept too: it says that the store holds the node.
        self.manifest: Manifest | None = meta if (committed and meta.kind in ("file", "special")) else None
        self.content: FileContent | None = None
        self.children: dict[str, Node] | None = {} if not committed and meta.kind == "dir" else None
        self.lookups = 0
        self.open_count = 0
        self.writers = 0  # open handles that can write: the version is unfinished while any is
        self.unlinked = False
        self.meta_dirty = False
        self.background_commits = 0  # commits that async_close left running
        self.lock = trio.Lock()
        self.listed_at = 0.0  # directories: when the store was last listed (trio clock)
        self.changed_at = 0.0  # last local create, commit or rename (trio clock)

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"

    def has_writer(self) -> bool:
        """Whether a handle open for writing refers to this node: its version is not finished."""
        return self.writers > 0  # counted per node: a release must not scan every open handle

    def needs_commit(self) -> bool:
        """Whether the store lags behind this node (and the node is still in the namespace)."""
        dirty = self.meta_dirty or (self.content is not None and self.content.dirty)
        return dirty and not self.unlinked

    def path(self) -> tuple[str, ...]:
        parts: list[str] = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            parts.append(node.name)
            node = node.parent
        return tuple(reversed(parts))

    def display_path(self) -> str:
        return "/" + "/".join(self.path())

    def size(self) -> int:
        if self.content is not None:
            return self.content.size
        if self.manifest is not None:
            return self.manifest.size
        return len(self.target.encode()) if self.kind == "symlink" else 0

    def stored_size(self) -> int:
        if self.content is not None:
            return self.content.stored_estimate()
        return self.manifest.stored_size() if self.manifest is not None else 0

    def stat(self) -> Stat:
        nlink = 0 if self.unlinked else 1  # 1 for directories too: 'unknown' to find(1)
        blocks = -(-self.stored_size() // 512) if self.kind == "file" else 0
        return Stat(self.ino, self.mode, nlink, self.uid, self.gid, self.size(), blocks,
                    self.mtime_ns, self.ctime_ns, self.rdev)

    def is_busy(self) -> bool:
        """Whether local state (open files, uncommitted data) must win over the store's."""
        return self.open_count > 0 or self.content is not None or self.meta_dirty

    def take_attributes(self, meta: Manifest) -> None:
        """Adopt attributes (and, for a file, the content map) committed elsewhere."""
        self.mode, self.uid, self.gid = meta.mode, meta.uid, meta.gid
        self.mtime_ns, self.ctime_ns, self.target = meta.mtime_ns, meta.ctime_ns, meta.target
        self.rdev = meta.rdev
        if self.kind in ("file", "special"):
            self.manifest = meta

    def to_manifest(self) -> Manifest:
        """The manifest that persists this node's current attributes (and content map)."""
        meta = Manifest(self.kind, self.mode, self.uid, self.gid, self.mtime_ns, self.ctime_ns,
                        target=self.target, rdev=self.rdev)
        if self.kind == "file" and self.content is not None:
            meta.size = self.content.size
            meta.chunk_size = self.content.chunk_size
            meta.chunks = self.content.chunk_refs()
        elif self.manifest is not None:
            meta.size, meta.chunk_size = self.manifest.size, self.manifest.chunk_size
            meta.chunks, meta.engine = self.manifest.chunks, self.manifest.engine
        return meta

    def set_type_bits(self) -> None:
        """Keep the file-type bits in ``mode`` consistent with ``kind``.

        A special file's type (fifo, socket, character or block device) lives only in its
        mode, which the manifest checks already held to one of those four.
        """
        if self.kind == "special":
            return
        kind_bits = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "symlink": stat.S_IFLNK}[self.kind]
        self.mode = kind_bits | stat.S_IMODE(self.mode)


@contextlib.asynccontextmanager
async def locked(*nodes: Node | None) -> AsyncIterator[None]:
    """Hold the locks of several nodes, taken in inode order so that two holders cannot deadlock."""
    async with contextlib.AsyncExitStack() as stack:
        for node in sorted({node for node in nodes if node is not None}, key=lambda node: node.ino):
            await stack.enter_async_context(node.lock)
        yield
