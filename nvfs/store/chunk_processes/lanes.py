"""The lane protocol between the daemon and a chunk process.

A lane is a socket pair (``SOCK_SEQPACKET``: one message per request or reply) between the
daemon and one thread of a chunk process; it carries one request at a time. A request is a
pickled tuple and may carry descriptors:

* ``("get", request, chunk_id, length, hash_name)`` with a new memfd of ``length`` bytes:
  the child GETs the object, decodes and verifies the chunk into the memfd;
* ``("put", offset, length, regions, target)`` with, on a lane's first put only, the memfd
  of the daemon's shared chunk buffers (:mod:`nvfs.store.shared_buffers`): the child hashes,
  codes and writes the chunk at ``offset`` into ``target`` (``None`` after the first).

The reply is ``(status, detail)``: ``"ok"`` with the put chunk's id, stored size and
encoding (or nothing for a get), else a failure that :meth:`Lane.receive` raises as the
store's own read or write would have.
"""

from __future__ import annotations

import mmap
import os
import pickle
import socket
from dataclasses import dataclass

from nvfs.backend import BackendError, ObjectNotFound
from nvfs.backend.object_get import ObjectGet
from nvfs.codec import Region
from nvfs.store.chunk import ChunkCorrupt

REPLY_LIMIT = 1 << 16  # bytes: a status and a message
READY = b"ready"  # a child's first message on each lane, once it has imported everything
START_TIMEOUT = 60.0  # seconds a new child may take to get ready
# How a chunk's memfd is mapped, by the child and then the daemon: faulted in by one call,
# not a page fault per 4 KiB.
CHUNK_MAP_FLAGS = mmap.MAP_SHARED | mmap.MAP_POPULATE
_FAILURES = {"missing": ObjectNotFound, "unreadable": BackendError, "corrupt": ChunkCorrupt}
# Seconds a chunk process has, past its GET's deadline, to decode and check the chunk (64 MiB
# at most) and answer, with room for a loaded machine; a child silent beyond that is taken for
# hung, and the daemon reads the chunk itself.
_ANSWER_MARGIN = 10.0


@dataclass(frozen=True)
class ChunkTarget:
    """Where and how a chunk process stores chunks: a directory store, as its superblock says."""

    root: str
    store_version: int
    hash_name: str
    level: int


class ChunkProcessFailed(Exception):
    """A chunk process did not answer (it died, hung or never started): the chunk is unknown."""


class ChunkProcessNotStarted(ChunkProcessFailed):
    """A chunk process was gone before it was ready: killed, or unable to start at all."""


class Lane:
    """One request at a time to one child, over a socket pair."""

    def __init__(self) -> None:
        self.socket, self.child_socket = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._ready = False  # until the child's thread for this lane said so
        self._sent_buffers = False  # whether the child has the shared buffers' memfd from this lane

    def put_request(self, buffers_fd: int, offset: int, length: int, regions: list[Region] | None,
                    target: ChunkTarget) -> tuple[bytes, list[int]]:
        """A put request and the descriptors to send with it.

        The memfd and the target go with a lane's first request only; the child keeps them, so
        the FUSE thread neither passes a descriptor nor pickles the target per chunk; regions go
        as plain tuples, cheaper to pickle than objects.
        """
        plain = None if regions is None else [(region.length, int(region.kind)) for region in regions]
        if self._sent_buffers:
            return pickle.dumps(("put", offset, length, plain, None)), []
        self._sent_buffers = True
        return pickle.dumps(("put", offset, length, plain, target)), [buffers_fd]

    def call(self, message: bytes, fds: list[int], timeout: float):
        """Send one request with ``fds``; the child's answer, or its failure raised here."""
        if not self._ready:
            self._wait_ready()
        self.socket.settimeout(timeout)
        self.send(message, fds)
        return self.receive()

    def send(self, message: bytes, fds: list[int]) -> None:
        try:
            socket.send_fds(self.socket, [message], fds)
        except OSError as exc:
            raise ChunkProcessFailed(f"chunk process did not take the request: {exc}") from None

    def receive(self):
        """The child's answer to the request sent last, or its failure raised here."""
        try:
            reply = self.socket.recv(REPLY_LIMIT)
        except OSError as exc:
            raise ChunkProcessFailed(f"chunk process did not answer: {exc}") from None
        if not reply:
            raise ChunkProcessFailed("chunk process exited")
        status, detail = pickle.loads(reply)
        if status != "ok":
            raise _FAILURES[status](detail)
        return detail

    def poll_ready(self) -> bool:
        """Whether the child has said it is ready on this lane, without waiting for it."""
        if not self._ready:
            try:
                self._ready = self.socket.recv(REPLY_LIMIT, socket.MSG_DONTWAIT | socket.MSG_PEEK) == READY
            except OSError:
                return False
            if self._ready:
                self.socket.recv(REPLY_LIMIT)
        return self._ready

    def _wait_ready(self) -> None:
        self.socket.settimeout(START_TIMEOUT)
        try:
            hello = self.socket.recv(REPLY_LIMIT)
        except OSError as exc:
            raise ChunkProcessNotStarted(f"chunk process did not start: {exc}") from None
        if hello != READY:
            raise ChunkProcessNotStarted("chunk process exited before it was ready")
        self._ready = True

    def release_child_end(self) -> None:
        """Close the child's socket here once the child holds it: its exit then reads as EOF."""
        self.child_socket.close()

    def close(self) -> None:
        self.socket.close()
        self.child_socket.close()


def chunk_memfd(length: int) -> int:
    """A new memfd of ``length`` bytes for a child to leave a decoded chunk in."""
    memfd = os.memfd_create("nvfs-chunk", os.MFD_CLOEXEC)
    try:
        os.ftruncate(memfd, length)
    except OSError:
        os.close(memfd)
        raise
    return memfd


def get_message(request: ObjectGet, chunk_id: str, length: int, hash_name: str) -> bytes:
    return pickle.dumps(("get", request, chunk_id, length, hash_name))


def get_timeout(request: ObjectGet) -> float:
    """Seconds to wait for a get: the child's GET fails by its deadline, and it answers then."""
    return request.settings.request_timeout + _ANSWER_MARGIN
