"""The store: namespace entries as manifests, file contents as content-addressed chunks.

Key layout (docs/FORMAT.md): ``nvfs.json`` (the superblock), ``chunks/ab/<hash>``
(one object per distinct chunk, shared by every file that holds those bytes) and
``tree/<path>`` (one manifest per file or symlink; ``tree/<dir>/#dir`` per directory).

Every method here blocks; the vfs layer calls them from worker threads. Chunks that an
in-memory file still refers to are *pinned* so that garbage collection, which deletes
chunks no manifest names, never takes them away.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nvfs.backend import Backend, BackendError, ErrnoCarrier, ListedObject, ObjectNotFound
from nvfs.codec import CpuEngine, Engine, Region, cpu_decodes
from nvfs.formats import LayoutTracker
from nvfs.store.chunk import ChunkCorrupt, chunk_hash, decode_chunk, encode_chunk
from nvfs.store.disk_cache import ChunkFileCache
from nvfs.store.fetch_pool import ChunkTarget, FetchPool, FetchProcessFailed, SentRequest
from nvfs.store.manifest import ChunkRef, Manifest, ManifestError, default_dir_manifest
from nvfs.store.names import DIR_MARKER, TREE_PREFIX, Path, dir_prefix, entry_key, listed_name
from nvfs.store.names import encode_name as encode_name  # where nvfs.vfs.names imports it from
from nvfs.store.slots import SharedSlots

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

# 3: chunk objects one directory level deep; 2: named by BLAKE3, two levels deep; 1: named by
# SHA-256, two levels deep (all still read and written, each in its own layout)
STORE_FORMAT_VERSION = 3
NEW_STORE_HASH = "blake3"
SUPERBLOCK_KEY = "nvfs.json"
CHUNK_PREFIX = "chunks/"
# Chunk (slot) size of files written by a mount without -o chunk_size. Larger chunks write
# faster (each costs Python work, a file or a request: a 2 GiB torch.save into a directory
# store took 3.10/3.24 s with 8 MiB, 3.46/3.55 s with 4 MiB, alternating), but a lazily read
# tensor then pulls in more around it, as the kernel reads around an mmap fault into the
# chunks on either side: safe_open of one 16 MiB tensor of a 1 GiB safetensors file from S3
# fetched 5.2% of the file's stored bytes with 8 MiB chunks, 3.9% with 4 MiB.
DEFAULT_CHUNK_SIZE = 4 << 20
_PRESENT_LIMIT = 1 << 20  # chunk ids remembered as stored, for dedup without a backend round trip
SHARED_GC_GRACE = 3600.0  # seconds a chunk on a shared backend is safe from other mounts' collectors
# Objects of one listing read at once from a shared (S3) backend: each GET waits on a round
# trip, not on this machine, so a large directory read one object at a time waits on thousands.
LISTING_READS = 16

# A chunk id anywhere in a manifest's text: what GC keeps alive of a manifest it cannot parse
_CHUNK_ID_TEXT = re.compile(rb"[0-9a-fA-F]{64}")


class StoreError(Exception):
    """The backend does not hold a usable nvfs store."""


class StoreUnavailable(ErrnoCarrier):
    """The backend failed (unreachable, refused, full): the operation did not happen.

    ``errno`` reports it: ENOSPC, EDQUOT, EFBIG or ENAMETOOLONG where the backend's failure
    was one of those, else EIO.
    """


class ChunkUnreadable(StoreUnavailable):
    """The backend failed to return a chunk; its bytes are unknown."""


def chunk_key(store_version: int, cid: str) -> str:
    """The key of chunk ``cid`` in a store of format ``store_version``.

    Stores of format 3 keep chunks in 256 directories: on a directory backend the
    65536 of the earlier two-level layout cost a new directory for most chunks of a new
    store, and each new directory, like each new file, an inode that ext4 searches for
    (saving 2 GiB into a new store, seven alternating pairs: 3.4-3.8 s instead of 3.4-4.3 s).
    """
    if store_version >= 3:
        return f"{CHUNK_PREFIX}{cid[:2]}/{cid}"
    return f"{CHUNK_PREFIX}{cid[:2]}/{cid[2:4]}/{cid}"


def write_chunk_object(backend: Backend, engine: Engine, key: str, data: bytes | memoryview,
                       regions: list[Region] | None, digest: bytes) -> tuple[int, str]:
    """Code ``data`` (hashing to ``digest``), store it as chunk object ``key``; its stored size, encoding.

    The one place a chunk object is written, by the daemon or by a write process. On a
    shared backend an existing chunk may be collected by another mount any moment: it is
    stored again, which also renews its age.
    """
    parts, encoded = encode_chunk(data, engine, regions, digest)
    if backend.shared or not backend.exists(key):
        backend.put_parts(key, parts, durable=False)
    return sum(len(part) for part in parts), encoded.name


class KnownChunks:
    """Chunks this process stored lately, so that the same content is not coded again.

    Chunk id -> stored size, encoding, when it was stored. Emptied when it holds
    ``_PRESENT_LIMIT`` ids, rather than growing without bound.
    """

    def __init__(self) -> None:
        self._known: dict[str, tuple[int, str, float]] = {}

    def get(self, cid: str) -> tuple[int, str, float] | None:
        return self._known.get(cid)

    def remember(self, cid: str, stored: int, name: str) -> tuple[int, str, float]:
        if len(self._known) >= _PRESENT_LIMIT:
            self._known.clear()
        known = self._known[cid] = (stored, name, time.time())
        return known

    def forget(self, cid: str) -> tuple[int, str, float] | None:
        return self._known.pop(cid, None)


def _reports_backend_failures(method):
    """Turn a backend failure inside a namespace operation into :class:`StoreUnavailable`."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except ObjectNotFound:
            raise
        except (BackendError, OSError) as exc:
            raise StoreUnavailable(str(exc)) from exc

    return wrapper


class _SharedExclusiveLock:
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


@contextlib.contextmanager
def _chunk_failures() -> Iterator[None]:
    """Failures to get a chunk object, as the store reports them: a missing object is corrupt."""
    try:
        yield
    except ObjectNotFound:
        raise ChunkCorrupt("chunk object is missing") from None
    except BackendError as exc:
        raise ChunkUnreadable(str(exc)) from exc


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


def _fetched_elsewhere(ref: ChunkRef) -> bool:
    """Whether a fetch process may decode the chunk.

    An empty chunk has nothing to decode, and a memfd of no bytes cannot be mapped; ANS
    chunks only the GPU engine decodes.
    """
    return bool(ref.length) and cpu_decodes(ref.codec)


@dataclass(frozen=True)
class PendingPut:
    """A chunk handed to a write process by :meth:`Store.begin_put`, its answer not yet read."""

    sent: SentRequest
    length: int

    @property
    def timeout(self) -> float:
        """Seconds to wait for the answer (the pool's ``store_timeout``)."""
        return self.sent.timeout

    def fileno(self) -> int:
        return self.sent.fileno()


class Store:
    """Files, directories and symlinks of one nvfs store on one backend."""

    def __init__(self, backend: Backend, engine: Engine, superblock: dict,
                 gc_grace: float | None = None, disk_cache: ChunkFileCache | None = None,
                 fetch_pool: FetchPool | None = None, write_pool: FetchPool | None = None,
                 write_buffers: SharedSlots | None = None) -> None:
        self.backend = backend
        self.engine = engine
        self.disk_cache = disk_cache
        self.fetch_pool = fetch_pool
        self.superblock = superblock
        self.version = int(superblock["nvfs_store"])
        self.hash_name = superblock.get("hash", "sha256")
        try:
            self.digest_of = chunk_hash(self.hash_name)
        except KeyError as exc:
            raise StoreError(f"{backend.describe()}: {SUPERBLOCK_KEY}: {exc.args[0]}") from None
        # On a shared backend another mount may be about to name a chunk that no manifest
        # names yet: only chunks older than the grace period are collected there.
        self.gc_grace = gc_grace if gc_grace is not None else (SHARED_GC_GRACE if backend.shared else 0.0)
        self._lock = threading.Lock()
        self._gc_lock = _SharedExclusiveLock()
        self._pins: dict[str, int] = {}
        self._gc_touched: set[str] | None = None
        self._namespace_moves = 0
        self._present = KnownChunks()
        self._manifests: dict[str, tuple[str, Manifest]] = {}  # key -> (version, manifest) last listed
        self._named: dict[str, tuple[str, frozenset[str]]] = {}  # key -> (version, chunk ids) last marked
        self._listing_pool: ThreadPoolExecutor | None = None  # made by the first listing that needs it
        # Write processes code with the CPU engine and write files: a directory store's only.
        root = backend.files_root()
        self.write_pool: FetchPool | None = None
        self.write_buffers: SharedSlots | None = None
        self._chunk_target: ChunkTarget | None = None
        if write_pool is not None and write_buffers is not None and isinstance(engine, CpuEngine) and root:
            self.write_pool, self.write_buffers = write_pool, write_buffers
            self._chunk_target = ChunkTarget(root, self.version, self.hash_name, engine.level)

    @classmethod
    def open(cls, backend: Backend, engine: Engine, gc_grace: float | None = None,
             disk_cache: ChunkFileCache | None = None, fetch_pool: FetchPool | None = None,
             write_pool: FetchPool | None = None, write_buffers: SharedSlots | None = None) -> Store:
        """Open the store on ``backend``, creating it if the backend is empty.

        ``fetch_pool`` serves reads where chunks come by signed GETs; ``write_pool`` stores
        chunks of a directory store coded by the CPU engine, from ``write_buffers`` (see
        :meth:`put_chunk`). Each is left unused elsewhere.
        """
        try:
            superblock = json.loads(backend.get(SUPERBLOCK_KEY))
        except ObjectNotFound:
            if not backend.is_empty():
                raise StoreError(
                    f"{backend.describe()} is not empty and holds no nvfs store (no {SUPERBLOCK_KEY})"
                ) from None
            superblock = cls._initialise(backend)
        except ValueError as exc:
            raise StoreError(f"{backend.describe()}: {SUPERBLOCK_KEY} is unreadable: {exc}") from exc
        version = superblock.get("nvfs_store") if isinstance(superblock, dict) else None
        if not isinstance(version, int):
            raise StoreError(f"{backend.describe()}: {SUPERBLOCK_KEY} is not an nvfs superblock")
        if version > STORE_FORMAT_VERSION:
            raise StoreError(f"{backend.describe()}: store format {version} is newer than this nvfs")
        # Fetch processes decode on the CPU what comes by signed GETs, whatever the engine: on
        # the GPU host a cold cat of 2 GiB from SeaweedFS read at 0.97-1.01 GB/s with the GPU
        # engine decoding in the daemon, which also ran the GETs, and at 1.25-1.28 with them in
        # fetch processes. Not with a disk cache (objects are cached here).
        if fetch_pool is not None and (disk_cache is not None
                                       or backend.chunk_request(CHUNK_PREFIX + "probe") is None):
            fetch_pool = None
        store = cls(backend, engine, superblock, gc_grace, disk_cache, fetch_pool, write_pool,
                    write_buffers)  # refuses an unknown hash
        backend.discard_incomplete()
        for pool in store.process_pools():
            pool.start()
        return store

    @staticmethod
    def _initialise(backend: Backend) -> dict:
        now = time.time_ns()
        superblock = {
            "nvfs_store": STORE_FORMAT_VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "hash": NEW_STORE_HASH,
            "chunk_size": DEFAULT_CHUNK_SIZE,
        }
        root = default_dir_manifest(now)
        backend.put(dir_prefix(()) + DIR_MARKER, root.to_bytes(), durable=True)
        backend.put(SUPERBLOCK_KEY, json.dumps(superblock, indent=1).encode(), durable=True)
        log.info("initialised a new nvfs store in %s", backend.describe())
        return superblock

    def key_bytes(self, key: str) -> int:
        """Length of ``key`` as the backend stores it, its prefix included (S3 allows 1024 bytes)."""
        return len((self.backend.prefix + key).encode())

    @property
    def chunk_size(self) -> int:
        return int(self.superblock.get("chunk_size", DEFAULT_CHUNK_SIZE))

    # ----- chunks -----------------------------------------------------------------

    @staticmethod
    def layout_tracker() -> LayoutTracker:
        """A tracker that learns a file's tensor layout from its chunks, for :meth:`put_chunk`."""
        return LayoutTracker()

    def chunk_key(self, cid: str) -> str:
        """The key of chunk ``cid``: where this store's format puts it (:func:`chunk_key`)."""
        return chunk_key(self.version, cid)

    def chunk_buffer(self, size: int) -> np.ndarray | None:
        """An uninitialised buffer of ``size`` bytes that :meth:`put_chunk` stores without a copy.

        ``None`` when this store has no write processes, no buffers of that size or all of
        them in use: the caller then makes its own, which :meth:`put_chunk` stores in this
        process.
        """
        buffers = self.write_buffers
        if buffers is None or buffers.size != size or not self.writes_elsewhere():
            return None
        return buffers.take()

    def writes_elsewhere(self) -> bool:
        """Whether write processes take chunks: not once their pool has turned itself off."""
        return self.write_pool is not None and self.write_pool.serving

    def release_idle_buffers(self) -> None:
        """Give the kernel the memory of the chunk buffers nobody is using (after writes stop)."""
        if self.write_buffers is not None:
            self.write_buffers.release_free_pages()

    @_reports_backend_failures
    def put_chunk(self, data: bytes | memoryview, regions: list[Region] | None = None) -> ChunkRef:
        """Store ``data`` as a chunk (once per distinct content) and pin it for the caller.

        Raises :class:`StoreUnavailable` where the backend failed (its ``errno`` is ENOSPC
        on a full store).

        ``regions`` say which values the bytes hold (from a :class:`LayoutTracker`); without
        them the engine guesses from the content.

        Data in a buffer from :meth:`chunk_buffer` is stored by a write process (here a
        worker thread waits for it; :meth:`begin_put` waits on the event loop instead): in
        this process the hashing, coding and writing, although each runs without the GIL,
        took the GIL back dozens of times per chunk, each time from the FUSE thread, which a
        ``torch.save`` waits for on every 1 MiB write (docs/decisions/write-processes.md).
        """
        offset = self._shared_offset(data)
        if offset is not None and self.writes_elsewhere():
            ref = self._put_elsewhere(offset, data, regions)
            if ref is not None:
                return ref
        digest = self.digest_of(data)
        cid = digest.hex()
        with self._gc_lock.shared():
            self.pin([cid])
            try:
                known = self._present.get(cid)
                if known is None or not self._still_safe(known[2]):
                    known = self._present.remember(cid, *write_chunk_object(
                        self.backend, self.engine, self.chunk_key(cid), data, regions, digest))
            except BaseException:
                self.unpin([cid])
                raise
        return ChunkRef(cid, len(data), known[0], known[1])

    def _shared_offset(self, data: memoryview) -> int | None:
        """Where ``data`` lies in the buffers shared with the write processes, if it does."""
        return self.write_buffers.offset_of(data) if self.write_buffers is not None else None

    def _put_elsewhere(self, offset: int, data: memoryview, regions: list[Region] | None) -> ChunkRef | None:
        """The chunk at ``offset`` of the shared buffers, stored by a write process; ``None``: store it here.

        The GC lock is held from before the chunk object exists until it is pinned, as in
        :meth:`put_chunk`'s own path: a collection cannot delete it in between.
        """
        assert self.write_pool is not None and self.write_buffers is not None and self._chunk_target
        with self._gc_lock.shared():
            try:
                cid, stored, name = self.write_pool.store(self.write_buffers.fd, offset, len(data), regions,
                                                          self._chunk_target)
            except FetchProcessFailed as exc:
                log.warning("a chunk of %d bytes: %s: storing it in the daemon", len(data), exc)
                return None
            return self._stored_elsewhere(cid, len(data), stored, name)

    def begin_put(self, data: memoryview, regions: list[Region] | None) -> PendingPut | None:
        """Hand ``data`` to a write process without waiting for anything, if it can take it now.

        For a caller on an event loop, which then waits for the result's descriptor to turn
        readable and calls :meth:`finish_put`: no thread of the daemon is involved, so none
        takes the GIL from the FUSE thread (:meth:`put_chunk` says why that matters).
        ``None``: the data is not in a shared buffer, no write process is ready, or a
        collection holds the GC lock; :meth:`put_chunk` then stores it.
        """
        offset = self._shared_offset(data)
        if offset is None or not self._gc_lock.try_shared():
            return None
        assert self.write_pool is not None and self.write_buffers is not None and self._chunk_target
        try:
            sent = self.write_pool.begin_store(self.write_buffers.fd, offset, len(data), regions,
                                               self._chunk_target)
        except FetchProcessFailed as exc:
            log.warning("a chunk of %d bytes: %s: handing it over again", len(data), exc)
            sent = None
        if sent is None:
            self._gc_lock.release_shared()
            return None
        return PendingPut(sent, len(data))

    @_reports_backend_failures
    def finish_put(self, pending: PendingPut, answered: bool) -> ChunkRef | None:
        """The chunk of :meth:`begin_put`, stored; ``None`` where its write process failed.

        ``answered``: whether the descriptor turned readable in time (``pending.timeout``);
        if not, the process is stopped. On ``None`` the caller stores the chunk with
        :meth:`put_chunk` (which tries a write process once more, then stores it itself).
        Raises :class:`StoreUnavailable` where the process could not write it (with the
        process's errno, as :meth:`put_chunk`).
        """
        assert self.write_pool is not None
        try:
            if not answered:
                self.write_pool.give_up(pending.sent)
                log.warning("a chunk of %d bytes: its write process did not answer in %.0f s: "
                            "handing it over again", pending.length, pending.timeout)
                return None
            try:
                cid, stored, name = self.write_pool.finish(pending.sent)
            except FetchProcessFailed as exc:
                log.warning("a chunk of %d bytes: %s: handing it over again", pending.length, exc)
                return None
            return self._stored_elsewhere(cid, pending.length, stored, name)
        finally:
            self._gc_lock.release_shared()

    def _stored_elsewhere(self, cid: str, length: int, stored: int, name: str) -> ChunkRef:
        """Pin and remember a chunk a write process stored (the caller holds the GC lock)."""
        self.pin([cid])
        self._present.remember(cid, stored, name)
        return ChunkRef(cid, length, stored, name)

    def _still_safe(self, stored_at: float) -> bool:
        """Whether a chunk this mount stored at ``stored_at`` cannot have been collected since."""
        return not self.backend.shared or time.time() - stored_at < self.gc_grace / 2

    def get_chunk(self, ref: ChunkRef) -> bytes | bytearray | memoryview:
        """The verified uncompressed bytes of a chunk; raises :class:`ChunkCorrupt`.

        With a disk cache, a cached copy is used if it verifies; one that does not is
        discarded and the chunk fetched again. Only verified objects are cached.
        """
        if self.disk_cache is not None:
            blob = self.disk_cache.get(ref.id)
            if blob is not None:
                try:
                    return self._decode(blob, ref)
                except ChunkCorrupt as exc:
                    log.warning("disk cache: copy of chunk %s is damaged (%s): fetching it again",
                                ref.id, exc)
                    self.disk_cache.discard(ref.id)
        key = self.chunk_key(ref.id)
        with _chunk_failures():
            if self.fetch_pool is not None:
                data = self._fetch_elsewhere(key, ref)
                if data is not None:
                    return data
            blob = self.backend.get(key, content_addressed=True)
        data = self._decode(blob, ref)
        if self.disk_cache is not None:
            self.disk_cache.put(ref.id, blob)
        return data

    def _fetch_elsewhere(self, key: str, ref: ChunkRef) -> memoryview | None:
        """The chunk as a fetch process GETs, decodes and checks it; ``None``: read it here."""
        assert self.fetch_pool is not None
        request = self.backend.chunk_request(key) if _fetched_elsewhere(ref) else None
        if request is None:
            return None
        try:
            return self.fetch_pool.fetch(request, ref.id, ref.length, self.hash_name)
        except FetchProcessFailed as exc:
            log.warning("chunk %s: %s: reading it in the daemon", ref.id, exc)
            return None

    def fetches_elsewhere(self) -> bool:
        """Whether fetch processes take chunk GETs: not once their pool has turned itself off."""
        return self.fetch_pool is not None and self.fetch_pool.serving

    def begin_get(self, ref: ChunkRef) -> SentRequest | None:
        """Ask a fetch process for a chunk without waiting for anything, if one can take it now.

        For a caller on an event loop, which then waits for the result's descriptor to turn
        readable and calls :meth:`finish_get`. No thread of the daemon is involved: a worker
        thread per chunk took the GIL from the FUSE thread, and cost it 116-130 us to hand
        over (2-core VM). ``None``: no process is ready, the chunk is not fetched that way, or
        the credentials are due to be looked up; :meth:`get_chunk` then reads it.
        """
        if self.fetch_pool is None or not _fetched_elsewhere(ref):
            return None  # a pool that turned itself off is ready for nothing: begin_fetch says so
        request = self.backend.chunk_request(self.chunk_key(ref.id), wait=False)
        if request is None:
            return None
        try:
            return self.fetch_pool.begin_fetch(request, ref.id, ref.length, self.hash_name)
        except FetchProcessFailed as exc:
            log.warning("chunk %s: %s: reading it in the daemon", ref.id, exc)
            return None

    def finish_get(self, sent: SentRequest, ref: ChunkRef, answered: bool) -> memoryview | None:
        """The chunk :meth:`begin_get` asked for; ``None`` where its fetch process failed.

        ``answered``: whether the descriptor turned readable in time (``sent.timeout``); if
        not, the process is stopped. On ``None`` the caller reads the chunk with
        :meth:`get_chunk`. Raises as :meth:`get_chunk` does.
        """
        assert self.fetch_pool is not None
        if not answered:
            self.fetch_pool.give_up(sent)
            log.warning("chunk %s: its fetch process did not answer in %.0f s: reading it in the daemon",
                        ref.id, sent.timeout)
            return None
        with _chunk_failures():
            try:
                return self.fetch_pool.finish_fetch(sent)
            except FetchProcessFailed as exc:
                log.warning("chunk %s: %s: reading it in the daemon", ref.id, exc)
                return None

    def _decode(self, blob: bytes | memoryview, ref: ChunkRef) -> bytes | bytearray | memoryview:
        return decode_chunk(blob, self.engine, ref.id, self.digest_of, ref.length)

    def pin(self, ids: Sequence[str]) -> None:
        with self._lock:
            for cid in ids:
                self._pins[cid] = self._pins.get(cid, 0) + 1
                if self._gc_touched is not None:
                    self._gc_touched.add(cid)

    def unpin(self, ids: Sequence[str]) -> None:
        with self._lock:
            for cid in ids:
                count = self._pins.get(cid, 0) - 1
                if count > 0:
                    self._pins[cid] = count
                else:
                    self._pins.pop(cid, None)

    # ----- namespace ----------------------------------------------------------------

    @_reports_backend_failures
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

    @_reports_backend_failures
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
        file_metas = self._read_all(lambda item: self._listed_file(prefix, item[1], item[2]), files)
        dir_metas = self._read_all(lambda item: self._listed_dir(path, prefix, *item), dirs)
        entries: dict[str, Manifest] = {}
        for (name, *_rest), meta in zip([*files, *dirs], [*file_metas, *dir_metas], strict=True):
            if meta is not None:
                entries[name] = meta
        return entries

    def _read_all(self, read: Callable, items: Sequence) -> Iterable:
        """``map(read, items)``, on a shared backend by up to :data:`LISTING_READS` threads."""
        if not self.backend.shared or len(items) < 2:
            return map(read, items)
        with self._lock:
            if self._listing_pool is None:
                self._listing_pool = ThreadPoolExecutor(LISTING_READS, thread_name_prefix="nvfs-list")
        return self._listing_pool.map(read, items)

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
        if len(self._manifests) >= _PRESENT_LIMIT:
            self._manifests.clear()
        self._manifests[key] = (version, manifest)
        return manifest

    @_reports_backend_failures
    def write_entry(self, path: Path, manifest: Manifest) -> None:
        """Durably create or replace an entry; a file's chunks are made durable first."""
        if manifest.kind == "file":
            self.backend.sync()
        key = dir_prefix(path) + DIR_MARKER if manifest.kind == "dir" else entry_key(path)
        self.backend.put(key, manifest.to_bytes(), durable=True)

    @_reports_backend_failures
    def delete_entry(self, path: Path, kind: str) -> None:
        self.backend.delete(dir_prefix(path) + DIR_MARKER if kind == "dir" else entry_key(path))

    @_reports_backend_failures
    def rename_entry(self, old: Path, new: Path, kind: str) -> None:
        """Move an entry, replacing a file at ``new`` or an empty directory there."""
        with self._lock:
            self._namespace_moves += 1
        if kind == "dir":
            self.backend.delete(dir_prefix(new) + DIR_MARKER)
            self.backend.rename_prefix(dir_prefix(old), dir_prefix(new))
        else:
            self.backend.rename(entry_key(old), entry_key(new))

    # ----- garbage collection -------------------------------------------------------

    def collect_garbage(self) -> tuple[int, int]:
        """Delete chunks that no manifest names and nothing pins; returns (chunks, bytes).

        The mark phase reads every manifest without blocking writers; chunks pinned while it
        runs are kept. A rename during the mark could hide a manifest from it, so the
        sweep is skipped and the mark retried when one happened.
        """
        for _attempt in range(3):
            with self._lock:
                self._gc_touched = set(self._pins)
                moves = self._namespace_moves
            try:
                live = self._mark()
                with self._gc_lock.exclusive():
                    with self._lock:
                        if moves != self._namespace_moves:
                            continue
                        keep = live | self._gc_touched | set(self._pins)
                    return self._sweep(keep)
            finally:
                with self._lock:
                    self._gc_touched = None
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
        fresh = dict(zip([entry.key for entry in stale], self._read_all(self._chunks_of, stale),
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
        young = time.time() - self.gc_grace
        for key, modified, _version in list(self.backend.iter_objects(CHUNK_PREFIX)):
            cid = key.rsplit("/", 1)[1]
            if cid in keep or (self.gc_grace and modified > young):
                continue
            known = self._present.forget(cid)
            self.backend.delete(key)
            count += 1
            freed += known[0] if known else 0
        if count:
            log.info("garbage collection deleted %d unreferenced chunks", count)
        return count, freed

    def process_pools(self) -> list[FetchPool]:
        """The pools of fetch and write processes this store uses (none, one or both)."""
        return [pool for pool in (self.fetch_pool, self.write_pool) if pool is not None]

    def wait_for_processes(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds in all for the processes to be ready; whether they are."""
        deadline = time.monotonic() + timeout
        return all(pool.wait_ready(deadline - time.monotonic()) for pool in self.process_pools())

    def close(self) -> None:
        for pool in self.process_pools():
            pool.close()
        if self._listing_pool is not None:
            self._listing_pool.shutdown()
        self.backend.close()
