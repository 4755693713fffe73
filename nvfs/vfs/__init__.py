"""VFS layer: inodes, open files, write buffers and read-ahead over the store."""

from nvfs.vfs.config import VfsConfig
from nvfs.vfs.errors import VfsError
from nvfs.vfs.filesystem import Vfs
from nvfs.vfs.handles import Handle
from nvfs.vfs.inodes import ROOT_INO
from nvfs.vfs.node import Node, Stat
from nvfs.vfs.xattrs import XATTR_PREFIX

__all__ = ["ROOT_INO", "XATTR_PREFIX", "Handle", "Node", "Stat", "Vfs", "VfsConfig", "VfsError"]
