"""The namespace: directories, files and symlinks as manifests under ``tree/``.

A file or symlink is one manifest object at its path's key; a directory is a key prefix,
with its attributes in a ``#dir`` marker (docs/FORMAT.md). Listings come from the backend,
which anyone who can write to it may fill: what is no usable entry is logged and skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from nvfs.backend import Backend, ObjectNotFound
from nvfs.store.errors import reports_backend_failures
from nvfs.store.keys import DIR_MARKER, Path, dir_prefix, entry_key, listed_name
from nvfs.store.manifest import Manifest, ManifestError, default_dir_manifest

log = logging.getLogger(__name__)

# Objects of one listing read at once from a shared (S3) backend: each GET waits on a round
# trip, not on this machine, so a large directory read one object at a time waits on thousands.
LISTING_READS = 16
LISTED_LIMIT = 1 << 20  # listed manifests remembered with their versions, to skip reading them again


class ListingReads:
    """Reads of many listed objects: on a shared backend by up to :data:`LISTING_READS` threads."""

    def __init__(self, backend: Backend) -> None:
        self._shared = backend.shared
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None  # made by the first listing that needs it

    def map(self, read: Callable, items: Sequence) -> Iterable:
        """``map(read, items)``; the results come in the order of ``items`` either way."""
        if not self._shared or len(items) < 2:
            return map(read, items)
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(LISTING_READS, thread_name_prefix="nvfs-list")
        return self._pool.map(read, items)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()


class Namespace:
    """Entries of one store: read, listed, written, deleted and renamed on its backend."""

    def __init__(self, backend: Backend, reads: ListingReads) -> None:
        self.backend = backend
        self.reads = reads
        self._lock = threading.Lock()
        self._moves = 0
        self._manifests: dict[str, tuple[str, Manifest]] = {}  # key -> (version, manifest) last listed

    @property
    def moves(self) -> int:
        """How many renames have begun: garbage collection marks again when it changed meanwhile."""
        with self._lock:
            return self._moves

    @reports_backend_failures
    def read_dir_meta(self, path: Path) -> Manifest:
        """Attributes of a directory; a prefix without a marker gets defaults."""
        return self._dir_marker(path) or default_dir_manifest(time.time_ns())

    def _dir_marker(self, path: Path) -> Manifest | None:
        """The directory's marker; ``None`` where it has none or a bad one (logged)."""
        key = dir_prefix(path) + DIR_MARKER
        try:
            meta = Manifest.from_bytes(self.backend.get(key))
        except ObjectNotFound:
            return None
        except ManifestError as exc:
            log.error("%s: %s: the directory gets default attributes", key, exc)
            return None
        if meta.kind != "dir":
            log.error("%s: a marker of type %s: the directory gets default attributes", key, meta.kind)
            return None
        return meta

    @reports_backend_failures
    def list_dir(self, path: Path) -> dict[str, Manifest]:
        """Every entry of a directory with its manifest. Bad names and manifests are logged, skipped.

        On a shared backend the manifests and markers are read :data:`LISTING_READS` at a
        time; the result is the same as reading them one by one.
        """
        prefix = dir_prefix(path)
        objects, prefixes = self.backend.list_dir(prefix)
        files = [(name, component, version) for component, version in objects.items()
                 if (name := listed_name(prefix, component)) is not None]
        dirs = [(name, component) for component in prefixes
                if (name := listed_name(prefix, component)) is not None]
        file_metas = self.reads.map(lambda item: self._listed_file(prefix, item[1], item[2]), files)
        dir_metas = self.reads.map(lambda item: self._listed_dir(path, prefix, *item), dirs)
        entries: dict[str, Manifest] = {}
        for (name, *_rest), meta in zip([*files, *dirs], [*file_metas, *dir_metas], strict=True):
            if meta is not None:
                entries[name] = meta
        return entries

    def _listed_file(self, prefix: str, component: str, version: str) -> Manifest | None:
        """The manifest of a listed object; ``None`` (logged) where it is no usable entry."""
        try:
            meta = self._manifest(prefix + component, version)
        except (ManifestError, ObjectNotFound) as exc:
            log.error("skipping %s: %s", prefix + component, exc)
            return None
        if meta.kind == "dir":  # a directory is a prefix with a marker, never an object
            log.error("skipping %s: a directory manifest outside a #dir marker", prefix + component)
            return None
        return meta

    def _listed_dir(self, path: Path, prefix: str, name: str, component: str) -> Manifest | None:
        """Attributes of a listed sub-prefix; ``None`` where it is no directory (any more)."""
        meta = self._dir_marker((*path, name))
        if meta is None:
            # A directory another tool made (keys only), or a prefix an object store
            # still lists after its last object went: only the first kind is real.
            if not self.backend.has_objects(prefix + component + "/"):
                return None
            meta = default_dir_manifest(time.time_ns())
        return meta

    def _manifest(self, key: str, version: str) -> Manifest:
        """A listed manifest, read again only if its version changed since the last listing."""
        known = self._manifests.get(key)
        if known is not None and known[0] == version:
            return known[1]
        manifest = Manifest.from_bytes(self.backend.get(key))
        if len(self._manifests) >= LISTED_LIMIT:
            self._manifests.clear()
        self._manifests[key] = (version, manifest)
        return manifest

    @reports_backend_failures
    def write_entry(self, path: Path, manifest: Manifest) -> None:
        """Durably create or replace an entry; a file's chunks are made durable first."""
        if manifest.kind == "file":
            self.backend.sync()
        key = dir_prefix(path) + DIR_MARKER if manifest.kind == "dir" else entry_key(path)
        self.backend.put(key, manifest.to_bytes(), durable=True)

    @reports_backend_failures
    def delete_entry(self, path: Path, kind: str) -> None:
        self.backend.delete(dir_prefix(path) + DIR_MARKER if kind == "dir" else entry_key(path))

    @reports_backend_failures
    def rename_entry(self, old: Path, new: Path, kind: str) -> None:
        """Move an entry, replacing a file at ``new`` or an empty directory there."""
        with self._lock:
            self._moves += 1
        if kind == "dir":
            self.backend.delete(dir_prefix(new) + DIR_MARKER)
            self.backend.rename_prefix(dir_prefix(old), dir_prefix(new))
        else:
            self.backend.rename(entry_key(old), entry_key(new))
