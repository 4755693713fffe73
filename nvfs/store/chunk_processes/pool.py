"""Chunk processes: fetching and storing chunks outside the daemon's GIL.

Why: on many cores a restore is held back by the daemon's GIL, not by the cores: worker
threads decoding chunks and the FUSE thread replying to reads take turns holding it
(docs/decisions/fetch-processes.md and write-processes.md give the numbers). Here a child
process, with its own interpreter and GIL, signs, GETs, decodes and verifies each chunk; the
daemon's event loop sends the request (:meth:`ChunkProcessPool.send_get`), waits for the
answer as for any descriptor, and maps the memory the child decoded the chunk into.

A child serves several *lanes* (:mod:`nvfs.store.chunk_processes.lanes`). The event loop
(:meth:`ChunkProcessPool.send_get`), or a worker thread where no lane is ready
(:meth:`ChunkProcessPool.get`), takes an idle lane and sends the unsigned GET with the
chunk's id and length, and with it a new memfd of that length, in which the child leaves
the decoded chunk; the reply is a status. The child checks the chunk exactly as the daemon
would (:mod:`nvfs.store.chunk_processes.child`). The daemon then maps the memfd
(:class:`~nvfs.store.chunk_processes.maps.ChunkMaps`) and hands the mapping up as the chunk:
no copy, and no buffer of the daemon's heap, which glibc would keep once freed. The chunk's
memory goes back to the kernel when the last view of it is dropped.

The same processes store chunks for a directory store (``-o write_procs``): with a lane's
first request the daemon passes the memfd of its shared chunk buffers
(:mod:`nvfs.store.shared_buffers`), with every request the chunk's place in it; the child
hashes, codes and writes the chunk object with the store's own function and answers with its
id, stored size and encoding (:meth:`ChunkProcessPool.put`, :meth:`ChunkProcessPool.send_put`).
A pool serves one direction: the store has one for gets and one for puts.

A child that dies fails its lanes' requests with :class:`ChunkProcessFailed` (the store
then reads or stores those chunks itself) and is started again on the next request, unless
it exited with an error before it was ready: then the pool turns itself off and says so in
the log.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from nvfs.backend.object_get import ObjectGet
from nvfs.codec import Region
from nvfs.store.chunk_processes.lanes import (
    ChunkProcessFailed,
    ChunkProcessNotStarted,
    ChunkTarget,
    Lane,
    chunk_memfd,
    get_message,
    get_timeout,
)
from nvfs.store.chunk_processes.maps import ChunkMaps

log = logging.getLogger(__name__)

CHILD_MODULE = "nvfs.store.chunk_processes.child"
_STOP_GRACE = 5.0  # seconds a child gets to exit after its sockets close
PUT_TIMEOUT = 600.0  # seconds a chunk process may take to store one chunk on a local disk (default)


class _Child:
    """A chunk process and its lanes."""

    def __init__(self, lanes: int) -> None:
        self.lanes = [Lane() for _ in range(lanes)]
        fds = [lane.child_socket.fileno() for lane in self.lanes]
        self.served = 0
        self.process = subprocess.Popen(
            [sys.executable, "-m", CHILD_MODULE, *map(str, fds)],
            pass_fds=fds, stdin=subprocess.DEVNULL, start_new_session=True)
        for lane in self.lanes:
            lane.release_child_end()

    def stop(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for the child to exit, then kill it."""
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass(frozen=True)
class SentRequest:
    """A request sent on a lane whose answer is still to be read (:meth:`ChunkProcessPool.send_put`).

    A get's (:meth:`ChunkProcessPool.send_get`) also holds the memfd the chunk is left in.
    """

    child: _Child
    lane: Lane
    timeout: float  # seconds to wait for the answer before taking the child for hung
    memfd: int = -1
    length: int = 0

    def fileno(self) -> int:
        """Readable once the answer is there."""
        return self.lane.socket.fileno()


class ChunkProcessPool:
    """``processes`` chunk processes, sharing ``calls`` lanes (chunk requests in flight).

    The daemon never runs more chunk calls at once than it has worker threads, so that is what
    to pass: each child is then as busy as the others and no lane stands idle.
    ``put_timeout``: seconds a child may take to store one chunk before it is taken for hung.
    """

    def __init__(self, processes: int, calls: int, put_timeout: float = PUT_TIMEOUT) -> None:
        self.processes = processes
        self.put_timeout = put_timeout
        self.lanes = -(-calls // processes)
        self.maps = ChunkMaps()
        self._children: list[_Child] = []
        self._idle: list[tuple[_Child, Lane]] = []
        self._cond = threading.Condition()
        self._off = False
        self._closed = False

    def get(self, request: ObjectGet, chunk_id: str, length: int, hash_name: str) -> memoryview:
        """The verified, decoded chunk ``chunk_id`` (``length`` > 0 bytes) that ``request`` GETs.

        Raises :class:`ObjectNotFound`, :class:`BackendError` or :class:`ChunkCorrupt` as the
        store's own read would, and :class:`ChunkProcessFailed` when no process could answer.
        """
        def get_on(lane: Lane) -> memoryview:
            memfd = chunk_memfd(length)
            try:
                lane.call(get_message(request, chunk_id, length, hash_name), [memfd], get_timeout(request))
                return self.maps.chunk_in(memfd, length)
            finally:
                os.close(memfd)

        return self._on_a_lane(get_on)

    def put(self, buffers_fd: int, offset: int, length: int, regions: list[Region] | None,
            target: ChunkTarget) -> tuple[str, int, str]:
        """Hash, code and write the chunk at ``offset`` of the memfd ``buffers_fd`` into ``target``.

        Returns the chunk's id, its stored size and its encoding's name. Raises
        :class:`BackendError` where the child could not write it, and
        :class:`ChunkProcessFailed` when no process could answer (the chunk may then be
        stored or not: the caller stores it itself, which writes the same object again).
        """
        return self._on_a_lane(lambda lane: lane.call(
            *lane.put_request(buffers_fd, offset, length, regions, target), self.put_timeout))

    @property
    def serving(self) -> bool:
        """False once the pool has turned itself off (or was closed): then nothing is sent."""
        return not (self._off or self._closed)

    def send_put(self, buffers_fd: int, offset: int, length: int, regions: list[Region] | None,
                 target: ChunkTarget) -> SentRequest | None:
        """Send :meth:`put`'s request on an idle lane, waiting for nothing; ``None``: no lane is ready.

        For a caller on an event loop: it waits for the returned request's descriptor to turn
        readable, then calls :meth:`receive_put` (or :meth:`give_up` after ``put_timeout``).
        Raises :class:`ChunkProcessFailed` where the child did not take the request.
        """
        taken = self._take_ready()
        if taken is None:
            return None
        child, lane = taken
        self._send(child, lane, *lane.put_request(buffers_fd, offset, length, regions, target))
        return SentRequest(child, lane, self.put_timeout)

    def send_get(self, request: ObjectGet, chunk_id: str, length: int, hash_name: str
                 ) -> SentRequest | None:
        """Send :meth:`get`'s request on an idle lane, waiting for nothing; ``None``: no lane is ready.

        As :meth:`send_put`; :meth:`receive_get` then takes the chunk.
        """
        taken = self._take_ready()
        if taken is None:
            return None
        child, lane = taken
        try:
            memfd = chunk_memfd(length)
        except OSError as exc:
            self._put_back(child, lane)
            raise ChunkProcessFailed(f"no memfd for the chunk: {exc}") from None
        try:
            self._send(child, lane, get_message(request, chunk_id, length, hash_name), [memfd])
        except ChunkProcessFailed:
            os.close(memfd)
            raise
        return SentRequest(child, lane, get_timeout(request), memfd, length)

    def _take_ready(self) -> tuple[_Child, Lane] | None:
        """An idle lane whose child is ready, taken without waiting; ``None``: there is none."""
        with self._cond:
            if not self.serving:
                return None
            self._start_missing()
            ready = [index for index, (_child, lane) in enumerate(self._idle) if lane.poll_ready()]
            if not ready:
                return None
            return self._idle.pop(ready[-1])

    def _send(self, child: _Child, lane: Lane, message: bytes, fds: list[int]) -> None:
        try:
            lane.send(message, fds)
        except ChunkProcessFailed:
            self._lost(child, started=True)
            self._put_back(child, lane)
            raise

    def receive_put(self, sent: SentRequest) -> tuple[str, int, str]:
        """The answer to a request :meth:`send_put` sent, now readable; raises as :meth:`put`."""
        return self._receive(sent)

    def _receive(self, sent: SentRequest):
        try:
            return sent.lane.receive()
        except ChunkProcessFailed:
            self._lost(sent.child, started=True)
            raise
        finally:
            self._put_back(sent.child, sent.lane)

    def receive_get(self, sent: SentRequest) -> memoryview:
        """The chunk a request :meth:`send_get` sent asked for, its answer now readable.

        Raises as :meth:`get`.
        """
        try:
            self._receive(sent)
            return self.maps.chunk_in(sent.memfd, sent.length)
        finally:
            os.close(sent.memfd)

    def give_up(self, sent: SentRequest) -> None:
        """The child did not answer in time: stop it (the caller fetches or stores the chunk itself)."""
        self._lost(sent.child, started=True)
        self._put_back(sent.child, sent.lane)
        if sent.memfd >= 0:
            os.close(sent.memfd)

    def _on_a_lane(self, request):
        child, lane = self._take()
        try:
            return request(lane)
        except ChunkProcessFailed as exc:
            self._lost(child, started=not isinstance(exc, ChunkProcessNotStarted))
            raise
        finally:
            self._put_back(child, lane)

    def _put_back(self, child: _Child, lane: Lane) -> None:
        """Make the lane idle again; the last user of a lane of a stopped child closes it."""
        with self._cond:
            if child in self._children:
                child.served += 1
                self._idle.append((child, lane))
                self._cond.notify()
                return
        lane.close()

    def start(self) -> None:
        """Start the children now, so that the first reads do not wait for their imports.

        Started on first use instead, a cold cat of 2 GiB on 16 cores had one GET in flight
        for its first 0.75 s and delivered nothing.
        """
        with self._cond:
            self._start_missing()

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every child to say it is ready on each idle lane.

        Why: :meth:`send_get` passes over a lane that is not ready yet, and the chunk then
        goes through a worker thread of the daemon, which waits for the child there and takes
        the GIL from the FUSE thread; a restore begun as soon as the mount returned read its
        first chunks that way. Returns whether all are ready: ``False`` after ``timeout``, or at
        once where a child has exited before it was ready (the pool then deals with it on use).
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                if not self.serving:
                    return False
                waiting = [lane.socket for _child, lane in self._idle if not lane.poll_ready()]
            if not waiting:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                readable, _, _ = select.select(waiting, [], [], left)
            except (OSError, ValueError):  # a lane closed meanwhile: its child was lost
                return False
            with self._cond:
                if any(lane.socket in readable and not lane.poll_ready() for _child, lane in self._idle):
                    return False  # it had something to read, and not READY: its child is gone

    def _start_missing(self) -> None:
        while len(self._children) < self.processes and not (self._off or self._closed):
            self._start_child()

    def _take(self) -> tuple[_Child, Lane]:
        """An idle lane of the least busy child (a child that died is replaced first)."""
        with self._cond:
            self._start_missing()
            while not self._idle:
                if self._off or self._closed:
                    raise ChunkProcessFailed("chunk processes are off")
                self._cond.wait()
            idle = collections.Counter(child for child, _lane in self._idle)
            choice = max(range(len(self._idle)), key=lambda i: idle[self._idle[i][0]])
            return self._idle.pop(choice)

    def _start_child(self) -> None:
        try:
            child = _Child(self.lanes)
        except OSError as exc:
            self._turn_off(f"cannot start a chunk process: {exc}")
            return
        self._children.append(child)
        self._idle.extend((child, lane) for lane in child.lanes)
        log.debug("chunk process %d started with %d lanes", child.process.pid, self.lanes)

    def _lost(self, child: _Child, started: bool) -> None:
        """Kill a child that failed a request; never restart one that could not start.

        A child that exited on its own (an error status) before it was ready would most
        likely be followed by others that do the same; one killed by a signal would not.
        """
        child.stop(0 if started else _STOP_GRACE)
        with self._cond:
            if child not in self._children:
                return  # another of its lanes reported it first
            idle = self._drop(child)
            if not started and child.process.returncode > 0:
                self._turn_off(f"chunk process {child.process.pid} exited with status "
                               f"{child.process.returncode} before it was ready")
            else:
                log.warning("chunk process %d failed after %d chunks: starting another",
                            child.process.pid, child.served)
            self._cond.notify_all()
        for lane in idle:
            lane.close()

    def _drop(self, child: _Child) -> list[Lane]:
        """Forget ``child`` (holding the lock); returns its idle lanes, which nobody uses now."""
        self._children.remove(child)
        idle = [lane for owner, lane in self._idle if owner is child]
        self._idle = [(owner, lane) for owner, lane in self._idle if owner is not child]
        return idle

    def _turn_off(self, reason: str) -> None:
        log.error("%s; the daemon fetches or stores chunks itself from now on", reason)
        self._off = True
        self._cond.notify_all()

    def close(self) -> None:
        """Close idle lanes (a child exits when all its lanes are closed) and stop the children.

        A lane in use is closed by its user, once the request in flight is answered.
        """
        with self._cond:
            self._closed = True
            children = list(self._children)
            idle = [lane for child in children for lane in self._drop(child)]
            self._cond.notify_all()
        for lane in idle:
            lane.close()
        for child in children:
            child.stop(_STOP_GRACE)
