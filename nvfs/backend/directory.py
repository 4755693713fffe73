"""A backend that keeps each object as a file below a local directory.

Key ``a/b/c`` is the file ``ROOT/a/b/c``. Atomic puts write a temporary file in
``ROOT/.tmp`` and rename it into place; durable puts also fsync the file and its
directory. Large non-durable puts (chunks) bypass the page cache (O_DIRECT) where the
filesystem allows it. :meth:`sync` is one ``syncfs(2)`` of the backing filesystem, which
is far cheaper than an fsync per chunk.

The store is private: objects are created 0600 and directories 0700, so that the contents
of a file the daemon's users may not read do not lie readable in the backing directory
(the umask can only take bits away from these). Keys come from the store itself and from
names users choose: a key that is not a relative path of plain components is refused, and
no symbolic link in the store is followed to an object.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import mmap
import os
import shutil
import stat
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nvfs.backend.base import Backend, Buffer, ListedObject
from nvfs.backend.errors import BackendError, ObjectNotFound, StoreLocked

log = logging.getLogger(__name__)

_TMP = ".tmp"
_ALIGN = 4096  # O_DIRECT offsets, lengths and memory: a multiple of the device's block size
_DIRECT_MIN = 1 << 20  # smaller objects go through the page cache
_BUFFER_STEP = 1 << 20  # the aligned buffer for O_DIRECT writes grows in these steps
_RENAME_ATTEMPTS = 10  # a directory pruned under a put each time (see _rename_into_place)
OBJECT_MODE = 0o600
DIRECTORY_MODE = 0o700
_libc = ctypes.CDLL(None, use_errno=True)


def make_private_dirs(path: Path) -> None:
    """Make ``path`` and its missing parents as :data:`DIRECTORY_MODE` directories.

    ``Path.mkdir(parents=True)`` would make the parents with the default mode.
    """
    missing: list[Path] = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, DIRECTORY_MODE)


def write_private(path: Path | str, data: bytes | memoryview) -> None:
    """Create the file ``path`` (never an existing one, nor through a link) holding ``data``, 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, OBJECT_MODE)
    os.fchmod(fd, OBJECT_MODE)  # whatever the umask
    with os.fdopen(fd, "wb") as file:
        file.write(data)


def read_no_follow(path: Path | str) -> bytes:
    """The whole file at ``path``, refusing a symbolic link there (ELOOP) rather than following it."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        parts = []
        while chunk := os.read(fd, max(size, 1 << 16)):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class _OpenFile:
    fd: int
    direct: bool


def _write_all(fd: int, view: memoryview, *, stop_unaligned: bool = False) -> int:
    """Write ``view`` (all of it, or up to a short write that leaves an unaligned offset)."""
    written = 0
    while written < len(view):
        count = os.write(fd, view[written:])
        written += count
        if stop_unaligned and written % _ALIGN:
            break
    return written


def _write_parts(fd: int, parts: Sequence[memoryview]) -> None:
    """Write the parts back to back: one ``writev`` for all of them, unless it writes short."""
    written = os.writev(fd, parts) if parts else 0
    for part in parts:
        if written >= len(part):
            written -= len(part)
            continue
        _write_all(fd, part[written:])
        written = 0


class DirectoryBackend(Backend):
    """Objects as files under ``root``; ``root`` must be an existing directory."""

    def __init__(self, root: str) -> None:
        path = Path(root)
        if not path.exists():
            raise BackendError(f"{root}: no such directory")
        if not path.is_dir():
            raise BackendError(f"{root}: not a directory")
        self.root = path.resolve()
        self._root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        self._tmp = self.root / _TMP
        self._direct = True  # until the filesystem refuses O_DIRECT
        self._buffers = threading.local()

    def describe(self) -> str:
        return str(self.root)

    def files_root(self) -> str | None:
        return str(self.root)

    def _path(self, key: str) -> Path:
        """The file of ``key``, which must be a relative path of plain components (below the root)."""
        if not key or "\0" in key or any(part in ("", ".", "..") for part in key.split("/")):
            raise BackendError(f"{self.root}: refusing key {key!r:.300}: not a relative path of plain "
                               f"components (an empty one, '.', '..', a leading '/' or a NUL)")
        return self.root / key

    def get(self, key: str, *, content_addressed: bool = False) -> bytes:
        try:
            return read_no_follow(self._path(key))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise ObjectNotFound(key) from exc
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ObjectNotFound(f"{key} (a symbolic link, not an object)") from exc
            raise

    def put(self, key: str, data: bytes, *, durable: bool) -> None:
        self.put_parts(key, (data,), durable=durable)

    def put_parts(self, key: str, parts: Sequence[Buffer], *, durable: bool) -> None:
        target = self._path(key)
        tmp = self._tmp / uuid.uuid4().hex
        views = [memoryview(part).cast("B") for part in parts]
        direct = not durable and self._direct and sum(len(view) for view in views) >= _DIRECT_MIN
        fd = self._create(tmp, direct)
        try:
            try:
                if fd.direct:
                    self._write_direct(fd.fd, views)
                else:
                    _write_parts(fd.fd, views)
                if durable:
                    os.fsync(fd.fd)
            finally:
                os.close(fd.fd)
            self._rename_into_place(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a full disk: its space is needed now, not at the next mount
            raise
        if durable:
            self._fsync_dir(target.parent)

    @staticmethod
    def _rename_into_place(tmp: Path, target: Path) -> None:
        """Rename, making the target's directories first only when they are missing.

        Most chunk directories exist already: trying first saves a mkdir per object. A delete
        prunes directories it empties, so one may vanish between the mkdir and the rename, or
        inside the mkdir (which then reports it as existing): both are retried.
        """
        for _ in range(_RENAME_ATTEMPTS):
            try:
                os.replace(tmp, target)
                return
            except FileNotFoundError:
                if not os.path.exists(tmp):
                    raise
            with contextlib.suppress(FileNotFoundError):
                make_private_dirs(target.parent)
        os.replace(tmp, target)

    def _create(self, path: Path, direct: bool) -> _OpenFile:
        """A new file in ``.tmp``, opened for direct I/O if asked and the filesystem allows it."""
        try:
            return self._open_new(path, direct)
        except FileNotFoundError:
            make_private_dirs(self._tmp)  # made by the first put, and again if it was removed
            return self._open_new(path, direct)

    def _open_new(self, path: Path, direct: bool) -> _OpenFile:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        if direct:
            try:
                return _OpenFile(os.open(path, flags | os.O_DIRECT, OBJECT_MODE), direct=True)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._direct = False  # tmpfs and some others refuse O_DIRECT
                log.info("%s does not take direct I/O: chunks go through the page cache", self.root)
        return _OpenFile(os.open(path, flags, OBJECT_MODE), direct=False)

    def _write_direct(self, fd: int, parts: Sequence[memoryview]) -> None:
        """Write whole blocks past the page cache, then the tail (less than a block) through it.

        The blocks are then on the device (its write cache) when this returns, so the
        ``syncfs`` before a manifest has little left to do, and chunks do not fill the page
        cache with pages nobody reads soon (on this VM first-touched page-cache pages cost
        more CPU than the copy itself). O_DIRECT needs aligned memory: the parts are copied
        into a per-thread buffer, which is also where they are joined.
        """
        total = sum(len(part) for part in parts)
        whole = total - total % _ALIGN
        buffer = self._aligned_buffer(total)
        # numpy copies with the GIL released (a slice assignment to the mmap would hold it)
        target = np.frombuffer(buffer, dtype=np.uint8, count=total)
        offset = 0
        for part in parts:
            target[offset : offset + len(part)] = np.frombuffer(part, dtype=np.uint8)
            offset += len(part)
        written = _write_all(fd, memoryview(buffer)[:whole], stop_unaligned=True)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
        _write_all(fd, memoryview(buffer)[written:total])

    def _aligned_buffer(self, size: int) -> mmap.mmap:
        buffer = getattr(self._buffers, "buffer", None)
        if buffer is None or len(buffer) < size:
            # Whole MiB: chunk objects differ in size by a few bytes, and every new buffer is
            # fresh memory whose pages fault in one by one.
            buffer = self._buffers.buffer = mmap.mmap(-1, -(-size // _BUFFER_STEP) * _BUFFER_STEP)
        return buffer

    @staticmethod
    def _fsync_dir(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        self._prune_empty_parents(path.parent)

    def _prune_empty_parents(self, path: Path) -> None:
        """Remove directories that deleting objects left empty, as an object store would."""
        while path != self.root:
            try:
                path.rmdir()
            except OSError:
                return
            path = path.parent

    def exists(self, key: str) -> bool:
        try:
            return stat.S_ISREG(os.lstat(self._path(key)).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def list_dir(self, prefix: str) -> tuple[dict[str, str], list[str]]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        objects: dict[str, str] = {}
        prefixes: list[str] = []
        try:
            entries = list(os.scandir(base))
        except (FileNotFoundError, NotADirectoryError):
            return objects, prefixes
        for entry in entries:
            if base == self.root and entry.name == _TMP:
                continue
            if entry.is_dir(follow_symlinks=False):
                prefixes.append(entry.name)
                continue
            if not entry.is_file(follow_symlinks=False):
                continue  # a symbolic link or a special file is no object
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            objects[entry.name] = _version(info)
        return objects, prefixes

    def iter_objects(self, prefix: str) -> Iterator[ListedObject]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        for dirpath, dirnames, filenames in os.walk(base):
            if dirpath == str(self.root) and _TMP in dirnames:
                dirnames.remove(_TMP)
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                try:
                    info = os.lstat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(info.st_mode):
                    continue  # a symbolic link or a special file is no object
                yield ListedObject(name if rel == "." else f"{rel}/{name}", info.st_mtime, _version(info))

    def rename(self, src: str, dst: str) -> None:
        source, target = self._path(src), self._path(dst)
        make_private_dirs(target.parent)
        try:
            os.replace(source, target)
        except FileNotFoundError as exc:
            raise ObjectNotFound(src) from exc
        self._fsync_dir(target.parent)
        if source.parent != target.parent:
            self._fsync_dir(source.parent)
            self._prune_empty_parents(source.parent)

    def rename_prefix(self, src: str, dst: str) -> None:
        source, target = self._path(src.rstrip("/")), self._path(dst.rstrip("/"))
        if not source.exists():
            return
        make_private_dirs(target.parent)
        if target.exists():
            # The caller guarantees that no object lives under dst: only empty folders.
            shutil.rmtree(target)
        os.rename(source, target)
        self._fsync_dir(target.parent)
        if source.parent != target.parent:
            self._fsync_dir(source.parent)
            self._prune_empty_parents(source.parent)

    def sync(self) -> None:
        if _libc.syncfs(self._root_fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs({self.root}) failed: {os.strerror(err)}")

    def is_empty(self) -> bool:
        return not any(os.scandir(self.root))

    def lock(self) -> None:
        try:
            fcntl.flock(self._root_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StoreLocked(f"{self.root} is in use by another nvfs daemon") from exc
            raise

    def discard_incomplete(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    def capacity(self) -> tuple[int, int] | None:
        st = os.statvfs(self.root)
        return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize

    def close(self) -> None:
        if self._root_fd >= 0:
            os.close(self._root_fd)
            self._root_fd = -1


def _version(info: os.stat_result) -> str:
    """A token that changes when the file at a key is replaced: a new file by rename, a new inode."""
    return f"{info.st_ino}-{info.st_size}-{info.st_mtime_ns}"
