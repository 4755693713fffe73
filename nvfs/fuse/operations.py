"""pyfuse3 request handlers.

Each handler converts names and attributes between pyfuse3's types and the vfs's, and
errors into ``FUSEError``. A bug surfacing as an unexpected exception is logged with its
traceback and answered with EIO instead of taking the whole mount down.
"""

from __future__ import annotations

import errno
import functools
import logging
import os

import pyfuse3

from nvfs.vfs import ROOT_INO, XATTR_PREFIX, Node, Stat, Vfs, VfsError
from nvfs.vfs.names import NAME_MAX

log = logging.getLogger(__name__)

ATTR_TIMEOUT = 1.0
PID_XATTR = b"user.nvfs.pid"
NVFS_XATTR_PREFIX = os.fsencode(XATTR_PREFIX)


def _translated(handler):
    """Turn vfs errors into FUSE errors and unexpected failures into EIO plus a log line."""

    @functools.wraps(handler)
    async def wrapper(*args, **kwargs):
        try:
            return await handler(*args, **kwargs)
        except VfsError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        except pyfuse3.FUSEError:
            raise
        except Exception:
            log.exception("internal error in %s", handler.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


def _name(raw: bytes) -> str:
    return os.fsdecode(raw)


def _attributes(st: Stat) -> pyfuse3.EntryAttributes:
    attrs = pyfuse3.EntryAttributes()
    attrs.st_ino = st.ino
    attrs.generation = 0
    attrs.entry_timeout = ATTR_TIMEOUT
    attrs.attr_timeout = ATTR_TIMEOUT
    attrs.st_mode = st.mode
    attrs.st_nlink = st.nlink
    attrs.st_uid = st.uid
    attrs.st_gid = st.gid
    attrs.st_rdev = st.rdev
    attrs.st_size = st.size
    attrs.st_blksize = 1 << 20
    attrs.st_blocks = st.blocks
    attrs.st_atime_ns = st.mtime_ns
    attrs.st_mtime_ns = st.mtime_ns
    attrs.st_ctime_ns = st.ctime_ns
    return attrs


def _forget_cached(ino: int, parent_ino: int | None, name: str) -> None:
    """Make the kernel drop its pages, attributes and directory entry of a file (blocks: call in a thread)."""
    try:
        pyfuse3.invalidate_inode(ino)
        if parent_ino is not None:
            pyfuse3.invalidate_entry(parent_ino, os.fsencode(name))
    except OSError as exc:  # the kernel holds nothing of it (any more)
        log.debug("invalidating inode %d: %s", ino, exc)


def writes_direct(flags: int, created: bool) -> bool:
    """Whether a new handle is written past the page cache (FUSE ``direct_io``).

    A write-only handle that creates or truncates its file -- ``torch.save``, ``cp``,
    safetensors writing a checkpoint -- gets ``direct_io``: the kernel hands the writer's own
    pages to nvfs instead of copying them into its page cache first, and a write no longer
    makes it ask nvfs for ``security.capability`` (which it does on every write(2) through
    the cache, waiting behind the writes queued before it). The cost is a round trip per
    request of a writer that writes a few KiB at a time (``-o cached_writes`` keeps the
    cache). A write-only handle that neither creates nor truncates (a patch in place) stays
    cached: the kernel moves the mtime only for cached writes and for O_TRUNC.
    """
    whole_file = created or bool(flags & os.O_TRUNC)
    return whole_file and (flags & os.O_ACCMODE) == os.O_WRONLY


class Operations(pyfuse3.Operations):
    """The kernel's view of a :class:`Vfs`."""

    supports_dot_lookup = True

    def __init__(self, vfs: Vfs, direct_writes: bool = True) -> None:
        super().__init__()
        self.vfs = vfs
        vfs.invalidate_kernel_cache = _forget_cached
        self._direct_writes = direct_writes
        # Page cache survives open/close only where no other mount can change a file.
        self._keep_cache = vfs.config.metadata_ttl is None
        # With the writeback cache the kernel gathers small writes into large ones and
        # answers re-reads of fresh data itself (close and fsync still write every dirty
        # page back first); but it then trusts its own file sizes, so files another mount
        # changes would keep their old size here: only for a store no one else writes.
        self.enable_writeback_cache = self._keep_cache

    def _open_flags(self, flags: int, created: bool) -> tuple[bool, bool]:
        """(direct_io, whether the handle's writes set the mtime) for a new handle.

        With the writeback cache the kernel keeps a file's mtime itself and does not advance
        it for direct writes (it set it when the file was created or truncated): a direct
        handle's writes leave the mtime where the kernel has it, or the mount would show
        one mtime and store another.
        """
        direct = self._direct_writes and writes_direct(flags, created)
        return direct, not (direct and self.enable_writeback_cache)

    def _file_info(self, fh: int, direct: bool) -> pyfuse3.FileInfo:
        return pyfuse3.FileInfo(fh=fh, keep_cache=self._keep_cache, direct_io=direct)

    def _entry(self, node: Node) -> pyfuse3.EntryAttributes:
        self.vfs.remember(node)
        return _attributes(node.stat())

    @_translated
    async def lookup(self, parent_inode, name, ctx=None):
        return self._entry(await self.vfs.lookup(parent_inode, _name(name)))

    async def forget(self, inode_list):
        for inode, count in inode_list:
            self.vfs.forget(inode, count)

    @_translated
    async def getattr(self, inode, ctx=None):
        return _attributes(self.vfs.getattr(inode))

    @_translated
    async def setattr(self, inode, attr, fields, fh, ctx):
        st = await self.vfs.setattr(
            inode,
            mode=attr.st_mode if fields.update_mode else None,
            uid=attr.st_uid if fields.update_uid else None,
            gid=attr.st_gid if fields.update_gid else None,
            size=attr.st_size if fields.update_size else None,
            mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
        )
        return _attributes(st)

    @_translated
    async def readlink(self, inode, ctx):
        return os.fsencode(self.vfs.readlink(inode))

    @_translated
    async def opendir(self, inode, ctx):
        await self.vfs.children(self.vfs.node(inode))
        return inode

    @_translated
    async def readdir(self, fh, start_id, token):
        children = await self.vfs.children(self.vfs.node(fh))
        names = sorted(children)
        for position in range(start_id, len(names)):
            child = children[names[position]]
            if not pyfuse3.readdir_reply(token, os.fsencode(names[position]), _attributes(child.stat()),
                                         position + 1):
                break
            self.vfs.remember(child)

    @_translated
    async def mkdir(self, parent_inode, name, mode, ctx):
        return self._entry(await self.vfs.mkdir(parent_inode, _name(name), mode, ctx.uid, ctx.gid))

    @_translated
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        node = await self.vfs.mknod(parent_inode, _name(name), mode, rdev, ctx.uid, ctx.gid)
        return self._entry(node)

    @_translated
    async def rmdir(self, parent_inode, name, ctx):
        await self.vfs.rmdir(parent_inode, _name(name))

    @_translated
    async def unlink(self, parent_inode, name, ctx):
        await self.vfs.unlink(parent_inode, _name(name))

    @_translated
    async def symlink(self, parent_inode, name, target, ctx):
        node = await self.vfs.symlink(parent_inode, _name(name), os.fsdecode(target), ctx.uid, ctx.gid)
        return self._entry(node)

    @_translated
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise VfsError(errno.EINVAL)
        await self.vfs.rename(parent_inode_old, _name(name_old), parent_inode_new, _name(name_new),
                              noreplace=bool(flags & pyfuse3.RENAME_NOREPLACE))

    async def link(self, inode, new_parent_inode, new_name, ctx):
        raise pyfuse3.FUSEError(errno.EPERM)  # hard links are not supported

    @_translated
    async def open(self, inode, flags, ctx):
        direct, sets_mtime = self._open_flags(flags, created=False)
        return self._file_info(await self.vfs.open(inode, flags, sets_mtime=sets_mtime), direct)

    @_translated
    async def create(self, parent_inode, name, mode, flags, ctx):
        direct, sets_mtime = self._open_flags(flags, created=True)
        fh, node = await self.vfs.create(parent_inode, _name(name), mode, ctx.uid, ctx.gid,
                                         sets_mtime=sets_mtime)
        return self._file_info(fh, direct), self._entry(node)

    @_translated
    async def read(self, fh, off, size):
        return await self.vfs.read(fh, off, size)

    @_translated
    async def write(self, fh, off, buf):
        return await self.vfs.write(fh, off, buf)

    @_translated
    async def flush(self, fh):
        await self.vfs.flush(fh)

    @_translated
    async def fsync(self, fh, datasync):
        await self.vfs.commit(self.vfs.handle(fh).node)

    @_translated
    async def release(self, fh):
        await self.vfs.release(fh)

    @_translated
    async def statfs(self, ctx):
        data = pyfuse3.StatvfsData()
        block = 4096
        capacity = self.vfs.statfs() or (1 << 50, 1 << 50)
        data.f_bsize = data.f_frsize = block
        data.f_blocks = capacity[0] // block
        data.f_bfree = data.f_bavail = capacity[1] // block
        data.f_files = data.f_ffree = data.f_favail = 1 << 32
        data.f_namemax = NAME_MAX
        return data

    @_translated
    async def getxattr(self, inode, name, ctx):
        if inode == ROOT_INO and name == PID_XATTR:
            return str(os.getpid()).encode()
        if not name.startswith(NVFS_XATTR_PREFIX):
            # The kernel asks for security.capability before writes: answer without
            # computing every attribute (the stored size walks all of a file's slots).
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        value = self.vfs.xattrs(inode).get(os.fsdecode(name))
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value

    @_translated
    async def listxattr(self, inode, ctx):
        names = [os.fsencode(name) for name in self.vfs.xattrs(inode)]
        return names + [PID_XATTR] if inode == ROOT_INO else names

    async def setxattr(self, inode, name, value, ctx):
        raise pyfuse3.FUSEError(errno.ENOTSUP)

    async def removexattr(self, inode, name, ctx):
        raise pyfuse3.FUSEError(errno.ENOTSUP)
