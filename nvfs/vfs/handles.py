"""Open files: the handle table, and the in-memory contents a file has while it is open or uncommitted."""

from __future__ import annotations

import errno
from dataclasses import dataclass

from nvfs.formats import LayoutTracker
from nvfs.store import Store
from nvfs.vfs.config import VfsConfig
from nvfs.vfs.content import FileContent
from nvfs.vfs.errors import VfsError
from nvfs.vfs.garbage import GarbageCollector
from nvfs.vfs.inodes import Inodes
from nvfs.vfs.node import Node


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


class OpenFiles:
    """Handles by number, and each open file's :class:`FileContent` with the chunk pins it holds."""

    def __init__(self, store: Store, inodes: Inodes, garbage: GarbageCollector, config: VfsConfig) -> None:
        self._store = store
        self._inodes = inodes
        self._garbage = garbage
        self._config = config
        self._handles: dict[int, Handle] = {}
        self._next_fh = 1

    def open_handle(self, node: Node, writable: bool, sets_mtime: bool) -> int:
        """A new handle of ``node``, its contents loaded; returns its number."""
        self.ensure_content(node)
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

    def close_handle(self, fh: int) -> Handle | None:
        """Forget handle ``fh`` (the kernel released it); ``None`` if it is not open."""
        handle = self._handles.pop(fh, None)
        if handle is not None:
            handle.node.open_count -= 1
            handle.node.writers -= handle.writable
        return handle

    def ensure_content(self, node: Node) -> FileContent:
        """The file's contents in memory, made from its manifest (or empty) on first use."""
        if node.content is None:
            manifest = node.manifest
            if manifest is not None:
                content = FileContent(manifest.chunk_size or self._config.chunk_size, manifest.size,
                                      list(manifest.chunks), LayoutTracker())
            else:
                content = FileContent(self._config.chunk_size, 0, [], LayoutTracker())
                content.dirty = True  # a new file: its first commit creates it
            self._store.pin(content.pinned_ids())
            node.content = content
        return node.content

    def release_content(self, node: Node) -> None:
        """Let go of a closed file's contents and their pins, unless they hold uncommitted data."""
        content = node.content
        if content is None or node.open_count > 0:
            return
        if content.dirty and not node.unlinked:
            return  # uncommitted data stays until a commit succeeds or the mount ends
        held = content.pinned_ids()
        self._store.unpin(held)
        committed = {ref.id for ref in node.manifest.chunks if ref} if node.manifest else set()
        if content.orphaned or not committed.issuperset(held):
            self._garbage.request()  # chunks stored for data that no manifest will name
        for slot in content.slots.values():
            slot.version += 1
        node.content = None
        self._inodes.drop_if_unused(node)
