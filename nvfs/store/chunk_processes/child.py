"""A chunk process: ``python -m nvfs.store.chunk_processes.child FD...``.

Started by :mod:`nvfs.store.chunk_processes.pool`. The arguments are inherited descriptors,
one per lane (:mod:`nvfs.store.chunk_processes.lanes`): a SOCK_SEQPACKET socket on which each
request comes with a memfd: for a get, the one the decoded chunk goes into; for a put, the
daemon's shared chunk buffers (:mod:`nvfs.store.shared_buffers`), which hold the chunk to
store. Each lane is served by a thread; the process exits when every lane's socket is
closed. It signs each GET itself (:class:`nvfs.backend.s3_reader.SigV4Get`, with botocore's
signer), so that the daemon's thread need not; writes go to a directory.
"""

from __future__ import annotations

import mmap
import os
import pickle
import socket
import sys
import threading

import numpy as np

from nvfs.backend import BackendError, ObjectNotFound, s3_reader  # noqa: F401  (see main)
from nvfs.backend.directory import DirectoryBackend
from nvfs.backend.http_get import ObjectGetter
from nvfs.backend.object_get import GetterSettings, ObjectGet
from nvfs.codec import CpuEngine, ElementKind, Engine, Region
from nvfs.gil import hand_over_quickly
from nvfs.heap import tune_heap
from nvfs.store.chunk import ChunkCorrupt, chunk_hash, decode_chunk
from nvfs.store.chunk_objects import KnownChunks, write_chunk_object
from nvfs.store.chunk_processes.lanes import CHUNK_MAP_FLAGS, READY, ChunkTarget
from nvfs.store.keys import chunk_key

_REQUEST_LIMIT = 1 << 16


class _Getters:
    """One getter (and its connection pool) per endpoint, shared by the lanes."""

    def __init__(self) -> None:
        self._getters: dict[GetterSettings, ObjectGetter] = {}
        self._lock = threading.Lock()

    def __call__(self, settings: GetterSettings) -> ObjectGetter:
        with self._lock:
            getter = self._getters.get(settings)
            if getter is None:
                getter = self._getters[settings] = ObjectGetter(settings)
            return getter


def _decode_into(memfd: int, request: ObjectGet, chunk_id: str, length: int, hash_name: str,
                 engine: Engine, getters: _Getters) -> None:
    """Leave the chunk in ``memfd``, checked as :meth:`nvfs.store.chunk_io.ChunkIO.get` checks it.

    Chunks of float planes decode straight into it: no buffer of their own, no copy.
    """
    blob = getters(request.settings).get(request.key, request.path, request.headers())
    target = memoryview(mmap.mmap(memfd, length, flags=CHUNK_MAP_FLAGS))
    data = decode_chunk(blob, engine, chunk_id, chunk_hash(hash_name), length, out=target)
    if data is not target:
        np.frombuffer(target, dtype=np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)


class _ChunkWriter:
    """Stores chunks from the daemon's shared buffers: one mapping, backend and engine for all lanes."""

    def __init__(self) -> None:
        self._buffers: memoryview | None = None
        self._identity: tuple[int, int] | None = None
        self._target: ChunkTarget | None = None
        self._backend: DirectoryBackend | None = None
        self._engine: CpuEngine | None = None
        self._known = KnownChunks()
        self._lock = threading.Lock()

    def store(self, buffers_fd: int | None, offset: int, length: int, regions: list[tuple[int, int]] | None,
              target: ChunkTarget | None) -> tuple[str, int, str]:
        """What :meth:`nvfs.store.chunk_io.ChunkIO.put` does on a directory store, from shared memory.

        ``buffers_fd`` and ``target`` come with a lane's first request only (``None`` after).
        """
        if buffers_fd is not None and target is not None:
            self._adopt(buffers_fd, target)
        buffers, target, backend, engine = self._buffers, self._target, self._backend, self._engine
        if buffers is None or target is None or backend is None or engine is None:
            raise BackendError("a write request came before the daemon's buffers")
        data = buffers[offset : offset + length]
        digest = chunk_hash(target.hash_name)(data)
        cid = digest.hex()
        key = chunk_key(target.store_version, cid)
        # As the store's own table, one here spares coding content stored before; the daemon's
        # collections do not reach it, so a remembered chunk must still be there. (No collection
        # runs while the daemon waits for this answer: it holds the GC lock's shared side.)
        known = self._known.get(cid)
        if known is None or not backend.exists(key):
            spans = None if regions is None else [Region(size, ElementKind(kind)) for size, kind in regions]
            known = self._known.remember(cid, *write_chunk_object(backend, engine, key, data, spans, digest))
        return cid, known[0], known[1]

    def _adopt(self, fd: int, target: ChunkTarget) -> None:
        """Map the daemon's buffers (once: every lane sends them) and open the store they go to."""
        status = os.fstat(fd)
        identity = (status.st_dev, status.st_ino)
        with self._lock:
            if identity != self._identity:
                self._buffers = memoryview(mmap.mmap(fd, status.st_size, flags=mmap.MAP_SHARED))
                self._identity = identity
            if target != self._target:
                self._backend, self._engine = DirectoryBackend(target.root), CpuEngine(target.level)
                self._target = target


def _serve(lane: socket.socket, engine: Engine, getters: _Getters, writer: _ChunkWriter) -> None:
    lane.send(READY)
    while True:
        message, fds, _flags, _address = socket.recv_fds(lane, _REQUEST_LIMIT, 1)
        if not message:
            return
        kind, *request = pickle.loads(message)
        try:
            if kind == "put":
                reply = ("ok", writer.store(fds[0] if fds else None, *request))
            else:
                _decode_into(fds[0], *request, engine, getters)
                reply = ("ok", "")
        except ObjectNotFound as exc:
            reply = ("missing", str(exc))
        except ChunkCorrupt as exc:
            reply = ("corrupt", str(exc))
        except BackendError as exc:
            reply = ("unreadable", str(exc))
        except OSError as exc:
            # As an OSError, which the daemon's BackendError carries: its errno (a full disk:
            # ENOSPC) then reaches the application that wrote the chunk.
            reply = ("unreadable", OSError(exc.errno, f"chunk process: {exc.strerror}", exc.filename))
        except Exception as exc:  # anything else would only kill the lane: report it instead
            reply = ("unreadable", f"chunk process: {type(exc).__name__}: {exc}")
        finally:
            for fd in fds:
                os.close(fd)
        lane.send(pickle.dumps(reply))


def _one_heap() -> None:
    """Serve every buffer from one heap that keeps at most 16 MiB free.

    With glibc's defaults each lane's thread gets its own arena, and once a 4 MiB buffer has
    been freed its successors come from that arena, which keeps them: four children of four
    lanes summed to 1.11 GiB (VmHWM) on a 2 GiB restore.
    """
    tune_heap(64 << 20, 16 << 20, 1)


def main(fds: list[int]) -> None:
    """Serve ``fds``' lanes until they close.

    The S3 signer (``s3_reader``, with botocore) is imported before the lanes say they are
    ready: unpickling the first GET would import it otherwise, 70 ms into a restore.
    """
    _one_heap()
    hand_over_quickly()
    engine = CpuEngine()
    getters = _Getters()
    writer = _ChunkWriter()
    lanes = [threading.Thread(target=_serve, args=(socket.socket(fileno=fd), engine, getters, writer))
             for fd in fds]
    for thread in lanes:
        thread.start()
    for thread in lanes:
        thread.join()


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]])
