"""Storing and fetching chunks: content-addressed, deduplicated, checked, pinned for the caller.

A chunk goes one of two ways, which give the same object and the same bytes:

* in a *chunk process* (:mod:`nvfs.store.chunk_processes`): a directory store's chunks in a
  shared buffer are hashed, coded and written by a write process; chunks that come by signed
  GETs (S3) are fetched, decoded and verified by a fetch process;
* here, in the daemon: everything else, and whatever a chunk process failed.

Why processes: in the daemon the hashing, coding and writing, although each runs without the
GIL, took the GIL back dozens of times per chunk, each time from the FUSE thread, which a
``torch.save`` waits for on every 1 MiB write (docs/decisions/write-processes.md); decoding
chunks held back a cold restore the same way (docs/decisions/fetch-processes.md).

Each store or fetch is a :class:`ChunkCall` (:meth:`ChunkIO.start_put`,
:meth:`ChunkIO.start_get`), which its caller completes the same way whichever way it goes.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Generic, TypeVar

from nvfs.backend import Backend
from nvfs.codec import CpuEngine, Engine, Region, cpu_decodes
from nvfs.store.chunk import ChunkCorrupt, decode_chunk
from nvfs.store.chunk_objects import KnownChunks, write_chunk_object
from nvfs.store.chunk_processes import ChunkProcessFailed, ChunkProcessPool, ChunkTarget, SentRequest
from nvfs.store.disk_cache import ChunkFileCache
from nvfs.store.errors import chunk_failures, reports_backend_failures
from nvfs.store.garbage import ChunkPins, SharedExclusiveLock
from nvfs.store.keys import chunk_key
from nvfs.store.manifest import ChunkRef
from nvfs.store.shared_buffers import SharedChunkBuffers

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

Result = TypeVar("Result")
ChunkBytes = bytes | bytearray | memoryview  # a fetched chunk: decoded here, or mapped from a fetch process


class ChunkCall(Generic[Result]):
    """One chunk to store or fetch: by a chunk process an event loop waits for, or in this process.

    How a caller on an event loop completes it (``nvfs.vfs``):

    1. where :attr:`may_send`, it calls :meth:`send`; ``True``: a chunk process has the call;
    2. it then waits up to :attr:`timeout` seconds for :meth:`fileno` to turn readable and calls
       :meth:`receive` with whether it did: the result, or ``None`` where the process failed;
    3. otherwise (not sent, or ``None``) it runs :meth:`finish` in a worker thread: the work done
       here (which may still hand the chunk to a chunk process, waiting for it in that thread).

    No thread of the daemon waits for a process sent a call: a worker thread per chunk took the
    GIL from the FUSE thread, and cost it 116-130 us to hand over (2-core VM).
    """

    may_send = False
    _sent: SentRequest | None = None

    def send(self) -> bool:
        """Hand the call to a chunk process if one can take it now, waiting for nothing."""
        return False

    @property
    def timeout(self) -> float:
        """Seconds to wait for a sent call's answer before its process is taken for hung."""
        assert self._sent is not None
        return self._sent.timeout

    def fileno(self) -> int:
        """A sent call's descriptor: readable once the answer is there."""
        assert self._sent is not None
        return self._sent.fileno()

    def receive(self, answered: bool) -> Result | None:
        """A sent call's result (``answered``: :meth:`fileno` turned readable in time); ``None``: failed."""
        raise NotImplementedError

    def finish(self) -> Result:
        """Do the call's work in this process (blocking: from a worker thread)."""
        raise NotImplementedError


class PutCall(ChunkCall[ChunkRef]):
    """A chunk to store (:meth:`ChunkIO.start_put`); its result, the stored chunk's reference, is pinned."""

    def __init__(self, chunks: ChunkIO, data: bytes | memoryview, regions: list[Region] | None) -> None:
        self.chunks = chunks
        self.data = data
        self.regions = regions
        self._offset = chunks.shared_offset(data)
        self.may_send = self._offset is not None and chunks.puts_by_process()

    def send(self) -> bool:
        """Hand the chunk to a write process, holding the GC lock's shared side until it is pinned.

        ``False``: the data is not in a shared buffer, no write process is ready, or a
        collection holds the GC lock.
        """
        chunks = self.chunks
        if not self.may_send or not chunks.gc_lock.try_shared():
            return False
        assert chunks.put_pool is not None and chunks.buffers is not None and chunks.target is not None
        try:
            self._sent = chunks.put_pool.send_put(chunks.buffers.fd, self._offset, len(self.data),
                                                  self.regions, chunks.target)
        except ChunkProcessFailed as exc:
            log.warning("a chunk of %d bytes: %s: handing it over again", len(self.data), exc)
        if self._sent is None:
            chunks.gc_lock.release_shared()
            return False
        return True

    @reports_backend_failures
    def receive(self, answered: bool) -> ChunkRef | None:
        """The stored chunk; ``None`` where the write process failed (it is stopped if it did not answer).

        Raises :class:`StoreUnavailable` where the process could not write it, with the
        process's errno, as :meth:`finish` would.
        """
        assert self._sent is not None and self.chunks.put_pool is not None
        try:
            if not answered:
                self.chunks.put_pool.give_up(self._sent)
                log.warning("a chunk of %d bytes: its write process did not answer in %.0f s: "
                            "handing it over again", len(self.data), self._sent.timeout)
                return None
            try:
                cid, stored, name = self.chunks.put_pool.receive_put(self._sent)
            except ChunkProcessFailed as exc:
                log.warning("a chunk of %d bytes: %s: handing it over again", len(self.data), exc)
                return None
            return self.chunks.stored_by_process(cid, len(self.data), stored, name)
        finally:
            self.chunks.gc_lock.release_shared()

    def finish(self) -> ChunkRef:
        return self.chunks.put(self.data, self.regions)


class GetCall(ChunkCall[ChunkBytes]):
    """A chunk to fetch (:meth:`ChunkIO.start_get`); its result, the verified uncompressed bytes."""

    def __init__(self, chunks: ChunkIO, ref: ChunkRef) -> None:
        self.chunks = chunks
        self.ref = ref
        self.may_send = chunks.gets_by_process(ref)

    def send(self) -> bool:
        """Ask a fetch process for the chunk; ``False``: no process is ready, or the credentials
        are due to be looked up (which blocks)."""
        if not self.may_send:
            return False
        chunks = self.chunks
        assert chunks.get_pool is not None
        request = chunks.backend.chunk_request(chunks.key(self.ref.id), wait=False)
        if request is None:
            return False
        try:
            self._sent = chunks.get_pool.send_get(request, self.ref.id, self.ref.length, chunks.hash_name)
        except ChunkProcessFailed as exc:
            log.warning("chunk %s: %s: reading it in the daemon", self.ref.id, exc)
        return self._sent is not None

    def receive(self, answered: bool) -> memoryview | None:
        """The chunk; ``None`` where its fetch process failed. Raises as :meth:`finish` does."""
        assert self._sent is not None and self.chunks.get_pool is not None
        if not answered:
            self.chunks.get_pool.give_up(self._sent)
            log.warning("chunk %s: its fetch process did not answer in %.0f s: reading it in the daemon",
                        self.ref.id, self._sent.timeout)
            return None
        with chunk_failures():
            try:
                return self.chunks.get_pool.receive_get(self._sent)
            except ChunkProcessFailed as exc:
                log.warning("chunk %s: %s: reading it in the daemon", self.ref.id, exc)
                return None

    def finish(self) -> ChunkBytes:
        return self.chunks.get(self.ref)


def fetched_by_process(ref: ChunkRef) -> bool:
    """Whether a fetch process may decode the chunk.

    An empty chunk has nothing to decode, and a memfd of no bytes cannot be mapped; ANS
    chunks only the GPU engine decodes.
    """
    return bool(ref.length) and cpu_decodes(ref.codec)


class ChunkIO:
    """The chunks of one store: stored once per distinct content, fetched and checked.

    ``get_pool`` fetches chunks that come by signed GETs; ``put_pool`` stores chunks of a
    directory store coded by the CPU engine, from ``buffers``. Each is left unused where it cannot serve.
    """

    def __init__(self, backend: Backend, engine: Engine, version: int, hash_name: str, digest_of,
                 pins: ChunkPins, gc_lock: SharedExclusiveLock, grace: float,
                 disk_cache: ChunkFileCache | None = None, get_pool: ChunkProcessPool | None = None,
                 put_pool: ChunkProcessPool | None = None, buffers: SharedChunkBuffers | None = None) -> None:
        self.backend = backend
        self.engine = engine
        self.version = version
        self.hash_name = hash_name
        self.digest_of = digest_of
        self.pins = pins
        self.gc_lock = gc_lock
        self.grace = grace
        self.disk_cache = disk_cache
        self.get_pool = get_pool
        self.known = KnownChunks()
        # Write processes code with the CPU engine and write files: a directory store's only.
        root = backend.files_root()
        self.put_pool: ChunkProcessPool | None = None
        self.buffers: SharedChunkBuffers | None = None
        self.target: ChunkTarget | None = None
        if put_pool is not None and buffers is not None and isinstance(engine, CpuEngine) and root:
            self.put_pool, self.buffers = put_pool, buffers
            self.target = ChunkTarget(root, version, hash_name, engine.level)

    def key(self, cid: str) -> str:
        """The key of chunk ``cid``: where this store's format puts it."""
        return chunk_key(self.version, cid)

    # ----- storing -------------------------------------------------------------------

    def buffer(self, size: int) -> np.ndarray | None:
        """An uninitialised buffer of ``size`` bytes that a write process stores without a copy.

        ``None`` when this store has no write processes, no buffers of that size or all of
        them in use: the caller then makes its own, which is stored in this process.
        """
        buffers = self.buffers
        if buffers is None or buffers.size != size or not self.puts_by_process():
            return None
        return buffers.take()

    def release_idle_buffers(self) -> None:
        """Give the kernel the memory of the chunk buffers nobody is using (after writes stop)."""
        if self.buffers is not None:
            self.buffers.release_free_pages()

    def puts_by_process(self) -> bool:
        """Whether write processes take chunks: not once their pool has turned itself off."""
        return self.put_pool is not None and self.put_pool.serving

    def shared_offset(self, data: bytes | memoryview) -> int | None:
        """Where ``data`` lies in the buffers shared with the write processes, if it does."""
        return self.buffers.offset_of(data) if self.buffers is not None else None

    def start_put(self, data: bytes | memoryview, regions: list[Region] | None) -> PutCall:
        """A call that stores ``data`` as a chunk (see :class:`ChunkCall`).

        ``regions`` say which values the bytes hold (from a layout tracker); without them
        the engine guesses from the content. Data in a buffer from :meth:`buffer` can go to
        a write process.
        """
        return PutCall(self, data, regions)

    @reports_backend_failures
    def put(self, data: bytes | memoryview, regions: list[Region] | None = None) -> ChunkRef:
        """Store ``data`` as a chunk (once per distinct content) and pin it for the caller.

        Data in a shared buffer goes to a write process, waited for here; otherwise, or
        where that fails, the chunk is stored in this process. Raises
        :class:`StoreUnavailable` where the backend failed (its ``errno`` is ENOSPC on a
        full store).
        """
        offset = self.shared_offset(data)
        if offset is not None and self.puts_by_process():
            ref = self._put_by_process(offset, data, regions)
            if ref is not None:
                return ref
        digest = self.digest_of(data)
        cid = digest.hex()
        with self.gc_lock.shared():
            self.pins.pin([cid])
            try:
                known = self.known.get(cid)
                if known is None or not self._still_safe(known[2]):
                    known = self.known.remember(cid, *write_chunk_object(
                        self.backend, self.engine, self.key(cid), data, regions, digest))
            except BaseException:
                self.pins.unpin([cid])
                raise
        return ChunkRef(cid, len(data), known[0], known[1])

    def _put_by_process(self, offset: int, data: bytes | memoryview, regions: list[Region] | None
                        ) -> ChunkRef | None:
        """The chunk at ``offset`` of the shared buffers, stored by a write process; ``None``: store it here.

        The GC lock is held from before the chunk object exists until it is pinned, as in
        :meth:`put`'s own path: a collection cannot delete it in between.
        """
        assert self.put_pool is not None and self.buffers is not None and self.target is not None
        with self.gc_lock.shared():
            try:
                cid, stored, name = self.put_pool.put(self.buffers.fd, offset, len(data), regions,
                                                      self.target)
            except ChunkProcessFailed as exc:
                log.warning("a chunk of %d bytes: %s: storing it in the daemon", len(data), exc)
                return None
            return self.stored_by_process(cid, len(data), stored, name)

    def stored_by_process(self, cid: str, length: int, stored: int, name: str) -> ChunkRef:
        """Pin and remember a chunk a write process stored (the caller holds the GC lock)."""
        self.pins.pin([cid])
        self.known.remember(cid, stored, name)
        return ChunkRef(cid, length, stored, name)

    def _still_safe(self, stored_at: float) -> bool:
        """Whether a chunk this mount stored at ``stored_at`` cannot have been collected since."""
        return not self.backend.shared or time.time() - stored_at < self.grace / 2

    # ----- fetching ------------------------------------------------------------------

    def gets_by_process(self, ref: ChunkRef) -> bool:
        """Whether a fetch process may take ``ref``: not once their pool has turned itself off."""
        return self.get_pool is not None and self.get_pool.serving and fetched_by_process(ref)

    def start_get(self, ref: ChunkRef) -> GetCall:
        """A call that fetches the chunk ``ref`` names (see :class:`ChunkCall`)."""
        return GetCall(self, ref)

    def get(self, ref: ChunkRef) -> ChunkBytes:
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
        key = self.key(ref.id)
        with chunk_failures():
            if self.get_pool is not None:
                data = self._get_by_process(key, ref)
                if data is not None:
                    return data
            blob = self.backend.get(key, content_addressed=True)
        data = self._decode(blob, ref)
        if self.disk_cache is not None:
            self.disk_cache.put(ref.id, blob)
        return data

    def _get_by_process(self, key: str, ref: ChunkRef) -> memoryview | None:
        """The chunk as a fetch process GETs, decodes and checks it; ``None``: read it here."""
        assert self.get_pool is not None
        request = self.backend.chunk_request(key) if fetched_by_process(ref) else None
        if request is None:
            return None
        try:
            return self.get_pool.get(request, ref.id, ref.length, self.hash_name)
        except ChunkProcessFailed as exc:
            log.warning("chunk %s: %s: reading it in the daemon", ref.id, exc)
            return None

    def _decode(self, blob: bytes | memoryview, ref: ChunkRef) -> ChunkBytes:
        return decode_chunk(blob, self.engine, ref.id, self.digest_of, ref.length)

    # ----- chunk processes -----------------------------------------------------------

    def process_pools(self) -> list[ChunkProcessPool]:
        """The pools of fetch and write processes (none, one or both)."""
        return [pool for pool in (self.get_pool, self.put_pool) if pool is not None]

    def wait_for_processes(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds in all for the processes to be ready; whether they are."""
        deadline = time.monotonic() + timeout
        return all(pool.wait_ready(deadline - time.monotonic()) for pool in self.process_pools())
