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
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

CACHE_MARKER = "nvfs-cache.json"
CACHE_FORMAT_VERSION = 1
_CHUNKS = "chunks"
_TMP = "tmp"
_LOW_WATER = 0.9  # eviction frees down to this share of the limit, so it runs now and then


class DiskCacheError(Exception):
    """The cache directory cannot be used (missing, or holding files that are not a cache)."""


class ChunkFileCache:
    """Stored chunk objects under ``root``, at most ``limit`` bytes of them."""

    def __init__(self, root: str, limit: int) -> None:
        self.root = Path(root)
        self.limit = limit
        try:
            self._claim()
            (self.root / _CHUNKS).mkdir(exist_ok=True)
            (self.root / _TMP).mkdir(exist_ok=True)
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
            marker.write_text(json.dumps({"nvfs_cache": CACHE_FORMAT_VERSION}))

    def _remove_abandoned_writes(self) -> None:
        """Delete temporary files of processes that died mid-write (other mounts' are live)."""
        for entry in os.scandir(self.root / _TMP):
            pid = entry.name.partition("-")[0]
            if pid.isdigit() and not _alive(int(pid)):
                Path(entry.path).unlink(missing_ok=True)

    def _path(self, cid: str) -> Path:
        return self.root / _CHUNKS / cid[:2] / cid[2:4] / cid

    def get(self, cid: str) -> bytes | None:
        """The cached object, marked as just used; ``None`` if it is not cached."""
        path = self._path(cid)
        try:
            with open(path, "rb") as f:
                blob = f.read()
            os.utime(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("disk cache: cannot read %s: %s", path, exc)
            return None
        return blob

    def put(self, cid: str, blob: bytes | memoryview) -> None:
        """Keep a verified object; a failure (a full disk) only means it is not cached."""
        path = self._path(cid)
        if path.exists():
            return
        tmp = self.root / _TMP / f"{os.getpid()}-{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as f:
                f.write(blob)
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            log.warning("disk cache: cannot store chunk %s: %s", cid, exc)
            return
        with self._lock:
            self._bytes += len(blob)
            if self._bytes > self.limit:
                self._evict()

    def discard(self, cid: str) -> None:
        """Remove a copy that failed verification."""
        self._path(cid).unlink(missing_ok=True)

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
