"""VFS layer: inodes, open files, write buffers and read-ahead over the store."""

from nvfs.vfs.errors import VfsError
from nvfs.vfs.filesystem import ROOT_INO, XATTR_PREFIX, Handle, Vfs, VfsConfig
from nvfs.vfs.node import Node, Stat

__all__ = ["ROOT_INO", "XATTR_PREFIX", "Handle", "Node", "Stat", "Vfs", "VfsConfig", "VfsError"]
