"""Fetch processes: chunk GETs, decoding and verification outside the daemon's GIL.

Why: on 16 cores a cold restore from S3 was held back by the GIL, not by the cores:
worker threads decoding chunks and the FUSE thread replying to reads took turns holding
it: a cold ``cat`` of 2 GiB ran at 1.05 GB/s with 4.6 s of daemon user CPU, while the
same file served from the daemon's memory cache ran at 3.0-3.8 GB/s with 0.1 s. Here a
child process, with its own interpreter and GIL, signs, GETs, decodes and verifies each
chunk; the daemon's event loop sends the request (:meth:`FetchPool.begin_fetch`), waits for
the answer as for any descriptor, and maps the memory the child decoded the chunk into.
With two children (8 lanes each) that cat ran at 1.24-1.49 GB/s (plain ``get_object``:
1.42-1.70) and the daemon's own CPU fell to about 2 s.

A child serves several *lanes*. A lane is a socket pair (``SOCK_SEQPACKET``: one message
per request or reply). The event loop (:meth:`FetchPool.begin_fetch`), or a worker thread
where no lane is ready (:meth:`FetchPool.fetch`), takes an idle lane and sends the unsigned
GET with the chunk's id and length, and with it a new memfd of that length, in which the
child leaves the decoded chunk; the reply is a status. The child checks the chunk exactly
as the daemon would (:mod:`nvfs.store.fetch_child`). The daemon then maps the memfd and
hands the mapping up as the chunk: no copy, and no buffer of the daemon's heap, which glibc
would keep once freed. The chunk's memory goes back to the kernel when the last view of it
is dropped.

The same processes store chunks for a directory store (``-o write_procs``): with a lane's
first request the daemon passes the memfd of its shared chunk buffers
(:mod:`nvfs.store.slots`), with every request the chunk's place in it; the child hashes, codes
and writes the chunk object with the store's own function and answers with its id, stored
size and encoding (:meth:`FetchPool.store`, :meth:`FetchPool.begin_store`).

A child that dies fails its lanes' requests with :class:`FetchProcessFailed` (the store
then reads or stores those chunks itself) and is started again on the next request, unless
it exited with an error before it was ready: then the pool turns itself off and says so in
the log.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import mmap
import os
import pickle
import resource
import select
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass

from nvfs.backend import BackendError, ObjectNotFound
from nvfs.backend.object_get import ObjectGet
from nvfs.codec import Region
from nvfs.store.chunk import ChunkCorrupt

log = logging.getLogger(__name__)

_REPLY_LIMIT = 1 << 16  # bytes: a status and a message
READY = b"ready"  # a child's first message on each lane, once it has imported everything
_START_TIMEOUT = 60.0  # seconds a new child may take to get ready
_STOP_GRACE = 5.0  # seconds a child gets to exit after its sockets close
# How a chunk's memfd is mapped, by the child and then the daemon: faulted in by one call,
# not a page fault per 4 KiB.
CHUNK_MAP_FLAGS = mmap.MAP_SHARED | mmap.MAP_POPULATE
_FAILURES = {"missing": ObjectNotFound, "unreadable": BackendError, "corrupt": ChunkCorrupt}
STORE_TIMEOUT = 600.0  # seconds a write process may take to store one chunk on a local disk (default)
# Seconds a fetch process has, past its GET's deadline, to decode and check the chunk (64 MiB
# at most) and answer, with room for a loaded machine; a child silent beyond that is taken for
# hung, and the daemon reads the chunk itself.
_ANSWER_MARGIN = 10.0


@dataclass(frozen=True)
class ChunkTarget:
    """Where and how a write process stores chunks: a directory store, as its superblock says."""

    root: str
    store_version: int
    hash_name: str
    level: int


@dataclass(frozen=True)
class SentRequest:
    """A request sent on a lane whose answer is still to be read (:meth:`FetchPool.begin_store`).

    A fetch's (:meth:`FetchPool.begin_fetch`) also holds the memfd the chunk is left in.
    """

    child: _Child
    lane: _Lane
    timeout: float  # seconds to wait for the answer before taking the child for hung
    memfd: int = -1
    length: int = 0

    def fileno(self) -> int:
        """Readable once the answer is there."""
        return self.lane.socket.fileno()


class FetchProcessFailed(Exception):
    """A chunk process did not answer (it died, hung or never started): the chunk is unknown."""


class FetchProcessNotStarted(FetchProcessFailed):
    """A fetch process was gone before it was ready: killed, or unable to start at all."""


class _Lane:
    """One request at a time to one child, over a socket pair."""

    def __init__(self, maps: ChunkMaps) -> None:
        self.socket, self.child_socket = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._maps = maps
        self._ready = False  # until the child's thread for this lane said so
        self._sent_buffers = False  # whether the child has the shared buffers' memfd from this lane

    def fetch(self, request: ObjectGet, chunk_id: str, length: int, hash_name: str) -> memoryview:
        memfd = _chunk_memfd(length)
        try:
            self._call(_fetch_message(request, chunk_id, length, hash_name), [memfd], _fetch_timeout(request))
            return self._maps.chunk_in(memfd, length)
        finally:
            os.close(memfd)

    def store(self, buffers_fd: int, offset: int, length: int, regions: list[Region] | None,
              target: ChunkTarget, timeout: float) -> tuple[str, int, str]:
        return self._call(*self.store_request(buffers_fd, offset, length, regions, target), timeout)

    def store_request(self, buffers_fd: int, offset: int, length: int, regions: list[Region] | None,
                      target: ChunkTarget) -> tuple[bytes, list[int]]:
        """A store request and the descriptors to send with it.

        The memfd and the target go with a lane's first request only; the child keeps them.
        Passing the descriptor and pickling the target each time cost the FUSE thread 0.3 ms
        per chunk (py-spy of a 2 GiB save: 7% of its samples); regions go as plain tuples.
        """
        plain = None if regions is None else [(region.length, int(region.kind)) for region in regions]
        if self._sent_buffers:
            return pickle.dumps(("put", offset, length, plain, None)), []
        self._sent_buffers = True
        return pickle.dumps(("put", offset, length, plain, target)), [buffers_fd]

    def _call(self, message: bytes, fds: list[int], timeout: float):
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
            raise FetchProcessFailed(f"chunk process did not take the request: {exc}") from None

    def receive(self):
        """The child's answer to the request sent last, or its failure raised here."""
        try:
            reply = self.socket.recv(_REPLY_LIMIT)
        except OSError as exc:
            raise FetchProcessFailed(f"chunk process did not answer: {exc}") from None
        if not reply:
            raise FetchProcessFailed("chunk process exited")
        status, detail = pickle.loads(reply)
        if status != "ok":
            raise _FAILURES[status](detail)
        return detail

    def poll_ready(self) -> bool:
        """Whether the child has said it is ready on this lane, without waiting for it."""
        if not self._ready:
            try:
                self._ready = self.socket.recv(_REPLY_LIMIT, socket.MSG_DONTWAIT | socket.MSG_PEEK) == READY
            except OSError:
                return False
            if self._ready:
                self.socket.recv(_REPLY_LIMIT)
        return self._ready

    def _wait_ready(self) -> None:
        self.socket.settimeout(_START_TIMEOUT)
        try:
            hello = self.socket.recv(_REPLY_LIMIT)
        except OSError as exc:
            raise FetchProcessNotStarted(f"chunk process did not start: {exc}") from None
        if hello != READY:
            raise FetchProcessNotStarted("chunk process exited before it was ready")
        self._ready = True

    def release_child_end(self) -> None:
        """Close the child's socket here once the child holds it: its exit then reads as EOF."""
        self.child_socket.close()

    def close(self) -> None:
        self.socket.close()
        self.child_socket.close()


def _chunk_memfd(length: int) -> int:
    """A new memfd of ``length`` bytes for a child to leave a decoded chunk in."""
    memfd = os.memfd_create("nvfs-chunk", os.MFD_CLOEXEC)
    try:
        os.ftruncate(memfd, length)
    except OSError:
        os.close(memfd)
        raise
    return memfd


def _fetch_message(request: ObjectGet, chunk_id: str, length: int, hash_name: str) -> bytes:
    return pickle.dumps(("get", request, chunk_id, length, hash_name))


def _fetch_timeout(request: ObjectGet) -> float:
    """Seconds to wait for a fetch: the child's GET fails by its deadline, and it answers then."""
    return request.settings.request_timeout + _ANSWER_MARGIN


class ChunkMaps:
    """Maps the chunks children leave in memfds, as many as the process can afford; copies the rest.

    A map needs no copy, but each costs a memory map (``vm.max_map_count``, 65530 by default)
    and, as CPython's mmap keeps a duplicate of the descriptor, an open file: a cache of 8 GiB
    in 4 MiB chunks would hold 2048 of them, past the usual soft limit of 1024, and the daemon
    could then open no socket. So the soft limit is raised to the hard one, and at most half of
    it, and of the map count, is used for chunks.
    """

    def __init__(self) -> None:
        self.limit = min(_raise_open_file_limit(), _max_map_count()) // 2
        self.mapped = 0
        self._lock = threading.Lock()

    def chunk_in(self, memfd: int, length: int) -> memoryview:
        """The ``length`` bytes a child left in ``memfd``: mapped, or read out into the heap."""
        if self._take():
            try:
                chunk = mmap.mmap(memfd, length, flags=CHUNK_MAP_FLAGS, prot=mmap.PROT_READ)
            except OSError as exc:
                self._give_back()
                log.debug("cannot map a fetched chunk (%s): copying it", exc)
            else:
                weakref.finalize(chunk, self._give_back)  # once the last view of it is gone
                return memoryview(chunk)
        data = bytearray(length)
        os.preadv(memfd, [data], 0)
        return memoryview(data)

    def _take(self) -> bool:
        with self._lock:
            if self.mapped >= self.limit:
                return False
            self.mapped += 1
            return True

    def _give_back(self) -> None:
        with self._lock:
            self.mapped -= 1


def _raise_open_file_limit() -> int:
    """Raise the soft limit on open files to the hard one; returns the soft limit then in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _max_map_count() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as knob:
            return int(knob.read())
    except (OSError, ValueError):
        return 65530  # the kernel's default


class _Child:
    """A fetch process and its lanes."""

    def __init__(self, lanes: int, maps: ChunkMaps) -> None:
        self.lanes = [_Lane(maps) for _ in range(lanes)]
        fds = [lane.child_socket.fileno() for lane in self.lanes]
        self.served = 0
        self.process = subprocess.Popen(
            [sys.executable, "-m", "nvfs.store.fetch_child", *map(str, fds)],
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


class FetchPool:
    """``processes`` fetch processes, sharing ``fetches`` lanes (chunk fetches in flight).

    The daemon never runs more fetches at once than it has worker threads, so that is what
    to pass: each child is then as busy as the others and no lane stands idle.
    ``store_timeout``: seconds a child may take to store one chunk before it is taken for hung.
    """

    def __init__(self, processes: int, fetches: int, store_timeout: float = STORE_TIMEOUT) -> None:
        self.processes = processes
        self.store_timeout = store_timeout
        self.lanes = -(-fetches // processes)
        self.maps = ChunkMaps()
        self._children: list[_Child] = []
        self._idle: list[tuple[_Child, _Lane]] = []
        self._cond = threading.Condition()
        self._off = False
        self._closed = False

    def fetch(self, request: ObjectGet, chunk_id: str, length: int, hash_name: str) -> memoryview:
        """The verified, decoded chunk ``chunk_id`` (``length`` > 0 bytes) that ``request`` GETs.

        Raises :class:`ObjectNotFound`, :class:`BackendError` or :class:`ChunkCorrupt` as the
        store's own read would, and :class:`FetchProcessFailed` when no process could answer.
        """
        return self._on_a_lane(lambda lane: lane.fetch(request, chunk_id, length, hash_name))

    def store(self, buffers_fd: int, offset: int, length: int, regions: list[Region] | None,
              target: ChunkTarget) -> tuple[str, int, str]:
        """Hash, code and write the chunk at ``offset`` of the memfd ``buffers_fd`` into ``target``.

        Returns the chunk's id, its stored size and its encoding's name. Raises
        :class:`BackendError` where the child could not write it, and
        :class:`FetchProcessFailed` when no process could answer (the chunk may then be
        stored or not: the caller stores it itself, which writes the same object again).
        """
        return self._on_a_lane(lambda lane: lane.store(buffers_fd, offset, length, regions, target,
                                                       self.store_timeout))

    @property
    def serving(self) -> bool:
        """False once the pool has turned itself off (or was closed): then nothing is sent."""
        return not (self._off or self._closed)

    def begin_store(self, buffers_fd: int, offset: int, length: int, regions: list[Region] | None,
                    target: ChunkTarget) -> SentRequest | None:
        """Send :meth:`store`'s request on an idle lane, waiting for nothing; ``None``: no lane is ready.

        For a caller on an event loop: it waits for the returned request's descriptor to turn
        readable, then calls :meth:`finish` (or :meth:`give_up` after ``store_timeout``).
        Raises :class:`FetchProcessFailed` where the child did not take the request.
        """
        taken = self._take_ready()
        if taken is None:
            return None
        child, lane = taken
        self._send(child, lane, *lane.store_request(buffers_fd, offset, length, regions, target))
        return SentRequest(child, lane, self.store_timeout)

    def begin_fetch(self, request: ObjectGet, chunk_id: str, length: int, hash_name: str
                    ) -> SentRequest | None:
        """Send :meth:`fetch`'s request on an idle lane, waiting for nothing; ``None``: no lane is ready.

        As :meth:`begin_store`; :meth:`finish_fetch` then takes the chunk.
        """
        taken = self._take_ready()
        if taken is None:
            return None
        child, lane = taken
        try:
            memfd = _chunk_memfd(length)
        except OSError as exc:
            self._put_back(child, lane)
            raise FetchProcessFailed(f"no memfd for the chunk: {exc}") from None
        try:
            self._send(child, lane, _fetch_message(request, chunk_id, length, hash_name), [memfd])
        except FetchProcessFailed:
            os.close(memfd)
            raise
        return SentRequest(child, lane, _fetch_timeout(request), memfd, length)

    def _take_ready(self) -> tuple[_Child, _Lane] | None:
        """An idle lane whose child is ready, taken without waiting; ``None``: there is none."""
        with self._cond:
            if not self.serving:
                return None
            self._start_missing()
            ready = [index for index, (_child, lane) in enumerate(self._idle) if lane.poll_ready()]
            if not ready:
                return None
            return self._idle.pop(ready[-1])

    def _send(self, child: _Child, lane: _Lane, message: bytes, fds: list[int]) -> None:
        try:
            lane.send(message, fds)
        except FetchProcessFailed:
            self._lost(child, started=True)
            self._put_back(child, lane)
            raise

    def finish(self, sent: SentRequest) -> tuple[str, int, str]:
        """The answer to a request :meth:`begin_store` sent, now readable; raises as :meth:`store`."""
        try:
            return sent.lane.receive()
        except FetchProcessFailed:
            self._lost(sent.child, started=True)
            raise
        finally:
            self._put_back(sent.child, sent.lane)

    def finish_fetch(self, sent: SentRequest) -> memoryview:
        """The chunk a request :meth:`begin_fetch` sent asked for, its answer now readable.

        Raises as :meth:`fetch`.
        """
        try:
            self.finish(sent)
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
        except FetchProcessFailed as exc:
            self._lost(child, started=not isinstance(exc, FetchProcessNotStarted))
            raise
        finally:
            self._put_back(child, lane)

    def _put_back(self, child: _Child, lane: _Lane) -> None:
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

        Why: :meth:`begin_fetch` passes over a lane that is not ready yet, and the chunk then
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

    def _take(self) -> tuple[_Child, _Lane]:
        """An idle lane of the least busy child (a child that died is replaced first)."""
        with self._cond:
            self._start_missing()
            while not self._idle:
                if self._off or self._closed:
                    raise FetchProcessFailed("chunk processes are off")
                self._cond.wait()
            idle = collections.Counter(child for child, _lane in self._idle)
            choice = max(range(len(self._idle)), key=lambda i: idle[self._idle[i][0]])
            return self._idle.pop(choice)

    def _start_child(self) -> None:
        try:
            child = _Child(self.lanes, self.maps)
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

    def _drop(self, child: _Child) -> list[_Lane]:
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
