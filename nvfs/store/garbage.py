"""Garbage collection: deleting chunk objects that no manifest names and nothing pins.

Chunks an in-memory file still refers to are *pinned* so that a collection never takes them
away. Chunk writers hold the shared side of :class:`SharedExclusiveLock` from before a chunk
object exists until it is pinned; a sweep holds the exclusive side, so it never sees a chunk
that is written but not yet pinned.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from nvfs.backend import Backend, ListedObject, ObjectNotFound
from nvfs.store.chunk_objects import KnownChunks
from nvfs.store.keys import CHUNK_PREFIX, DIR_MARKER, TREE_PREFIX
from nvfs.store.manifest import Manifest, ManifestError
from nvfs.store.namespace import Namespace

log = logging.getLogger(__name__)

SHARED_GC_GRACE = 3600.0  # seconds a chunk on a shared backend is safe from other mounts' collectors
MARK_ATTEMPTS = 3  # marks one pass tries while renames keep changing the namespace under it
# A chunk id anywhere in a manifest's text: what GC keeps alive of a manifest it cannot parse
_CHUNK_ID_TEXT = re.compile(rb"[0-9a-fA-F]{64}")


def collection_grace(backend: Backend, gc_grace: float | None) -> float:
    """Seconds a new chunk is safe from collection: ``gc_grace``, or the backend's default.

    On a shared backend another mount may be about to name a chunk that no manifest names
    yet: only chunks older than the grace period are collected there.
    """
    if gc_grace is not None:
        return gc_grace
    return SHARED_GC_GRACE if backend.shared else 0.0


class SharedExclusiveLock:
    """Many chunk writers at once, or one garbage-collection sweep."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            self._shared += 1
        try:
            yield
        finally:
            self.release_shared()

    def try_shared(self) -> bool:
        """Take a shared hold without waiting: False while a sweep holds or awaits the lock."""
        with self._cond:
            if self._exclusive:
                return False
            self._shared += 1
            return True

    def release_shared(self) -> None:
        with self._cond:
            self._shared -= 1
            self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            self._exclusive = True
            self._cond.wait_for(lambda: self._shared == 0)
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class ChunkPins:
    """Chunk ids held by in-memory files (counted), and those pinned while a mark runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pins: dict[str, int] = {}
        self._touched: set[str] | None = None  # while a mark runs: every id pinned since it began

    def pin(self, ids: Sequence[str]) -> None:
        with self._lock:
            for cid in ids:
                self._pins[cid] = self._pins.get(cid, 0) + 1
                if self._touched is not None:
                    self._touched.add(cid)

    def unpin(self, ids: Sequence[str]) -> None:
        with self._lock:
            for cid in ids:
                count = self._pins.get(cid, 0) - 1
                if count > 0:
                    self._pins[cid] = count
                else:
                    self._pins.pop(cid, None)

    def begin_mark(self) -> None:
        with self._lock:
            self._touched = set(self._pins)

    def held_since_mark(self) -> set[str]:
        """Every id pinned when the mark began, pinned since, or pinned now."""
        with self._lock:
            return (self._touched or set()) | set(self._pins)

    def end_mark(self) -> None:
        with self._lock:
            self._touched = None


def _chunks_named(key: str, blob: bytes | memoryview) -> set[str]:
    """The chunk ids manifest ``key`` names, for garbage collection.

    A manifest that does not parse (damaged, or of a newer format) may still name chunks
    that some nvfs reads: every chunk id anywhere in its text is kept alive rather than
    letting it stop the collection or lose those chunks.
    """
    try:
        manifest = Manifest.from_bytes(blob)
    except ManifestError as exc:
        named = {cid.decode().lower() for cid in _CHUNK_ID_TEXT.findall(bytes(blob))}
        log.error("garbage collection: %s: %s: keeping the %d chunk ids in its text", key, exc, len(named))
        return named
    return {ref.id for ref in manifest.chunks if ref is not None}


@dataclass
class GarbageCollector:
    """Mark (every chunk a manifest names) and sweep (every other chunk, unless pinned or young)."""

    backend: Backend
    namespace: Namespace
    pins: ChunkPins
    lock: SharedExclusiveLock
    known: KnownChunks
    grace: float
    # manifest key -> (its listed version, the chunk ids it names), as last marked
    _named: dict[str, tuple[str, frozenset[str]]] = field(default_factory=dict, init=False)

    def collect(self) -> tuple[int, int]:
        """Delete chunks that no manifest names and nothing pins; returns (chunks, bytes).

        The mark phase reads every manifest without blocking writers; chunks pinned while it
        runs are kept. A rename during the mark could hide a manifest from it, so the
        sweep is skipped and the mark retried when one happened.
        """
        for _attempt in range(MARK_ATTEMPTS):
            self.pins.begin_mark()
            moves = self.namespace.moves
            try:
                live = self._mark()
                with self.lock.exclusive():
                    if moves != self.namespace.moves:
                        continue
                    return self._sweep(live | self.pins.held_since_mark())
            finally:
                self.pins.end_mark()
        log.info("garbage collection skipped: the namespace kept changing")
        return 0, 0

    def _mark(self) -> set[str]:
        """Every chunk id a manifest names.

        A manifest whose version is the one an earlier pass read is not read again: a burst
        of deletes asks for a pass after each, and each pass then costs a listing plus the
        manifests that changed, not one GET per file of the store.
        """
        listed = [entry for entry in self.backend.iter_objects(TREE_PREFIX)
                  if not entry.key.endswith("/" + DIR_MARKER)]
        known = self._named
        stale = [entry for entry in listed
                 if not entry.version or known.get(entry.key, ("",))[0] != entry.version]
        fresh = dict(zip([entry.key for entry in stale], self.namespace.reads.map(self._chunks_of, stale),
                         strict=True))
        live: set[str] = set()
        named: dict[str, tuple[str, frozenset[str]]] = {}
        for entry in listed:
            ids = fresh[entry.key] if entry.key in fresh else known[entry.key][1]
            if ids is None:
                continue  # deleted while we listed; a rename would have restarted the mark
            live.update(ids)
            named[entry.key] = (entry.version, ids)
        self._named = named  # only what the store still holds
        return live

    def _chunks_of(self, entry: ListedObject) -> frozenset[str] | None:
        """The chunk ids of one listed manifest; ``None`` where it is gone."""
        try:
            return frozenset(_chunks_named(entry.key, self.backend.get(entry.key)))
        except ObjectNotFound:
            return None

    def _sweep(self, keep: set[str]) -> tuple[int, int]:
        count = freed = 0
        young = time.time() - self.grace
        for key, modified, _version in list(self.backend.iter_objects(CHUNK_PREFIX)):
            cid = key.rsplit("/", 1)[1]
            if cid in keep or (self.grace and modified > young):
                continue
            known = self.known.forget(cid)
            self.backend.delete(key)
            count += 1
            freed += known[0] if known else 0
        if count:
            log.info("garbage collection deleted %d unreferenced chunks", count)
        return count, freed
