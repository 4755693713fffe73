"""POSIX rules for new entries: how long names and paths may be, and what a setgid directory passes on."""

from __future__ import annotations

import errno
import stat
from collections.abc import Iterator

from nvfs.store import Store
from nvfs.store.keys import DIR_MARKER, dir_prefix, encode_name, entry_key
from nvfs.vfs.errors import VfsError
from nvfs.vfs.node import Node

# NAME_MAX of Linux filesystems, and of the file system under a directory store: the name
# itself and its key component (one byte longer for a name starting with '#', twice as long
# plus two for a name that is not UTF-8) must both fit.
NAME_MAX = 255
# S3's limit on an object key, in bytes of UTF-8, the bucket prefix included. A directory
# store keeps the same limit, so that a store moves between backends unchanged.
KEY_MAX = 1024

# The file types mknod(2) makes as nodes without contents (the manifest kind "special").
SPECIAL_TYPES = frozenset({stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK})

Path = tuple[str, ...]


def entry_key_of(path: Path, kind: str) -> str:
    """The object that holds the entry at ``path``: a directory's marker, else its manifest."""
    return dir_prefix(path) + DIR_MARKER if kind == "dir" else entry_key(path)


def check_name_length(name: str) -> None:
    """ENAMETOOLONG for a name longer than NAME_MAX: such a name can name nothing (ext4 answers so too)."""
    if len(name.encode(errors="surrogateescape")) > NAME_MAX:
        raise VfsError(errno.ENAMETOOLONG)


def check_new_path(store: Store, path: Path, kind: str) -> None:
    """ENAMETOOLONG unless an entry of ``kind`` can be stored at ``path``.

    Checked before anything is stored: the backend would refuse the key (S3 with an error
    that is EIO to the caller, a directory store with ENAMETOOLONG part way through).
    """
    check_name_length(path[-1])
    if len(encode_name(path[-1]).encode()) > NAME_MAX:
        raise VfsError(errno.ENAMETOOLONG)
    if store.key_bytes(entry_key_of(path, kind)) > KEY_MAX:
        raise VfsError(errno.ENAMETOOLONG)


def check_moved_tree(store: Store, node: Node, new_path: Path) -> None:
    """ENAMETOOLONG unless ``node`` and every entry below it that this mount has listed fit at ``new_path``.

    Entries of directories never listed here are not known without listing the whole
    subtree; a rename that lengthens their keys beyond the limit fails in the backend.
    """
    check_new_path(store, new_path, node.kind)
    growth = len(entry_key(new_path).encode()) - len(entry_key(node.path()).encode())
    if growth <= 0 or not node.is_dir:
        return
    longest = max((store.key_bytes(entry_key_of(below.path(), below.kind)) for below in listed_below(node)),
                  default=0)
    if longest and longest + growth > KEY_MAX:
        raise VfsError(errno.ENAMETOOLONG)


def listed_below(directory: Node) -> Iterator[Node]:
    """Every entry below ``directory`` in the directories this mount has listed."""
    for child in (directory.children or {}).values():
        yield child
        if child.is_dir:
            yield from listed_below(child)


def inherited(parent: Node, mode: int, gid: int, *, is_dir: bool) -> tuple[int, int]:
    """The (mode, gid) of a new entry in ``parent``, given the creator's mode and group.

    In a directory with S_ISGID the entry takes the directory's group, and a new directory
    keeps S_ISGID so that the rule holds for its subtree. The kernel has already cleared
    S_ISGID from a new file's mode where the creator is not in that group.
    """
    if not parent.mode & stat.S_ISGID:
        return mode, gid
    return (mode | stat.S_ISGID if is_dir else mode), parent.gid
