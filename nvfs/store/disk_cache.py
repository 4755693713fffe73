"""A local disk cache of chunk objects (``-o cache_dir=PATH,cache_dir_size=SIZE``).

Chunk objects are immutable and named by the SHA-256 of their contents, so a copy on
local disk never goes stale, can be shared by every mount on the machine (of any store)
and survives restarts. The store keeps objects here in their stored (compressed) form
after it has verified them, and verifies them again on every use: a damaged or truncated
copy (a crash, a full disk, a stray write) is discarded and fetched from the store again.

Layout (docs/FORMAT.md): ``nvfs-cache.json`` marks the directory, ``chunks/ab/cd/<id>``
holds the objects (the store's own key layout), ``tmp/<pid>-<random>`` holds writes in
progress; a finished write is renamed into place, so readers see a whole file or none.

Least recently used objects go first once the cache holds more than ``limit`` bytes. A
hit sets the file's mtime, which is the use clock, and eviction lists the directory
itself, so several mounts sharing a directory keep one bound between them.

Chunk ids come from manifests, which anyone who can write to the store can write: a path
is built only from an id that is a chunk id, is checked to lie under the cache's root once
resolved, and is opened without following a symbolic link, so that nothing outside the
cache is read or deleted. The cache is private like a directory store: files 0600,
directories 0700.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from pathlib import Path

from nvfs.backend.directory import make_private_dirs, read_no_follow, write_private
from nvfs.store.manifest import is_chunk_id

log = logging.getLogger(__name__)

CACHE_MARKER = "nvfs-cache.json"
CACHE_FORMAT_VERSION = 1
_CHUNKS = "chunks"
_TMP = "tmp"
_LOW_WATER = 0.9  # eviction frees down to this share of the limit, so it runs now and then
_ID_RULE = "a chunk id (64 lowercase hex digits)"


class DiskCacheError(Exception):
    """The cache directory cannot be used (missing, or holding files that are not a cache)."""


class ChunkFileCache:
    """Stored chunk objects under ``root``, at most ``limit`` bytes of them."""

    def __init__(self, root: str, limit: int) -> None:
        self.root = Path(root).resolve()
        self.limit = limit
        try:
            self._claim()
            for part in (_CHUNKS, _TMP):
                make_private_dirs(self.root / part)
                self._confined(self.root / part)
            self._remove_abandoned_writes()
        except OSError as exc:
            raise DiskCacheError(f"cache_dir {root}: {exc.strerror or exc}") from None
        self._lock = threading.Lock()
        self._bytes = sum(size for _path, size, _used in self._entries())

    def _claim(self) -> None:
        """Use an empty directory or an nvfs cache; refuse anything else (eviction deletes files)."""
        if not self.root.is_dir():
            raise DiskCacheError(f"cache_dir {self.root}: no such directory")
        marker = self.root / CACHE_MARKER
        if marker.exists():
            try:
                version = json.loads(marker.read_text()).get("nvfs_cache")
            except (ValueError, AttributeError):
                version = None
            if not isinstance(version, int) or version > CACHE_FORMAT_VERSION:
                raise DiskCacheError(f"cache_dir {self.root}: {CACHE_MARKER} is not a cache this nvfs knows")
        elif any(self.root.iterdir()):
            raise DiskCacheError(f"cache_dir {self.root} is not empty and is not an nvfs cache")
        else:
            write_private(marker, json.dumps({"nvfs_cache": CACHE_FORMAT_VERSION}).encode())

    def _remove_abandoned_writes(self) -> None:
        """Delete temporary files of processes that died mid-write (other mounts' are live)."""
        for entry in os.scandir(self.root / _TMP):
            pid = entry.name.partition("-")[0]
            if pid.isdigit() and not _alive(int(pid)):
                Path(entry.path).unlink(missing_ok=True)

    def _path(self, cid: str) -> Path:
        """Where chunk ``cid`` is cached; :class:`DiskCacheError` for anything but a chunk id."""
        if not is_chunk_id(cid):
            raise DiskCacheError(f"refusing chunk id {cid!r:.300}: not {_ID_RULE}")
        return self.root / _CHUNKS / cid[:2] / cid[2:4] / cid

    def _confined(self, path: Path) -> Path:
        """``path`` if, with symbolic links resolved, it lies under the root; else :class:`DiskCacheError`."""
        if not Path(os.path.realpath(path)).is_relative_to(self.root):
            raise DiskCacheError(f"cache_dir {self.root}: {path} leads outside it")
        return path

    def _existing_path(self, cid: str) -> Path:
        """:meth:`_path`, its directory checked to lie under the root (files are opened without following)."""
        path = self._path(cid)
        self._confined(path.parent)
        return path

    def get(self, cid: str) -> bytes | None:
        """The cached object, marked as just used; ``None`` if it is not cached (or cannot be)."""
        try:
            path = self._existing_path(cid)
            blob = read_no_follow(path)
            os.utime(path, follow_symlinks=False)
        except DiskCacheError as exc:
            log.error("disk cache: %s", exc)
            return None
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("disk cache: cannot read %s: %s", path, exc)
            return None
        return blob

    def put(self, cid: str, blob: bytes | memoryview) -> None:
        """Keep a verified object; a failure (a full disk) only means it is not cached."""
        tmp = self.root / _TMP / f"{os.getpid()}-{uuid.uuid4().hex}"
        try:
            path = self._path(cid)
            if os.path.lexists(path):
                return
            write_private(tmp, blob)
            make_private_dirs(path.parent)
            os.replace(tmp, self._existing_path(cid))
        except (OSError, DiskCacheError) as exc:
            tmp.unlink(missing_ok=True)
            log.warning("disk cache: cannot store chunk %s: %s", cid, exc)
            return
        with self._lock:
            self._bytes += len(blob)
            if self._bytes > self.limit:
                self._evict()

    def discard(self, cid: str) -> None:
        """Remove a copy that failed verification (unlink removes a link, never what it names)."""
        try:
            self._existing_path(cid).unlink(missing_ok=True)
        except DiskCacheError as exc:
            log.error("disk cache: %s", exc)

    def _entries(self) -> list[tuple[str, int, float]]:
        """Every cached object as (path, size, last use); objects vanish under other mounts."""
        found = []
        for directory, _dirs, names in os.walk(self.root / _CHUNKS):
            for name in names:
                path = os.path.join(directory, name)
                try:
                    info = os.stat(path)
                except FileNotFoundError:
                    continue
                found.append((path, info.st_size, info.st_mtime))
        return found

    def _evict(self) -> None:
        """Delete the least recently used objects until the cache is below its low-water mark."""
        entries = sorted(self._entries(), key=lambda entry: entry[2])
        total = sum(size for _path, size, _used in entries)
        target = int(self.limit * _LOW_WATER)
        removed = 0
        for path, size, _used in entries:
            if total <= target:
                break
            Path(path).unlink(missing_ok=True)
            total -= size
            removed += 1
        self._bytes = total
        log.debug("disk cache: evicted %d objects, %d bytes still cached", removed, total)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
