"""A fast local stage in front of a slower backend (``-o stage_dir=``).

Every put lands in a local directory first, durable there when asked, and is uploaded to
the real backend by background threads; a close or fsync returns once the data is safe
on local disk, and training goes on while the checkpoint drains to S3.

Order is what keeps readers safe: chunks upload in any order and in parallel, but a
manifest (any key outside ``chunks/``) is uploaded only once everything staged before it
is uploaded, so the remote store never names a chunk it does not have. A staged object
is removed locally only after its upload, so a crash at any moment leaves it in one
place or both; the next mount with the same stage finds what is left and drains it.
The daemon drains everything before it exits (``nvfs umount`` waits for it).
Uploads give way to writers: they start once the stage has been quiet for a moment.
The stage is private: its directories are 0700 and its files 0600, whatever the umask, as
the store's own objects are.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

from nvfs.backend.base import Backend, Buffer, ListedObject
from nvfs.backend.directory import DIRECTORY_MODE, DirectoryBackend, make_private_dirs, write_private
from nvfs.backend.errors import BackendError, ObjectNotFound
from nvfs.backend.object_get import ObjectGet

log = logging.getLogger(__name__)

STAGE_MARKER = "nvfs-stage.json"
_CHUNKS = "chunks/"
_RETRY_SECONDS = (1, 2, 5, 10, 30)
# Uploads use CPU (and the S3 server's, if it is local) that writers leave idle: on a busy
# machine close returns sooner and the drain takes longer.
_UPLOADER_NICENESS = 19
_WRITERS_QUIET = 0.5  # seconds without a put before uploads start (see _writers_first)


class StagedBackend(Backend):
    """``remote`` behind a local stage directory holding at most ``limit`` staged bytes."""

    def __init__(self, remote: Backend, stage_dir: str, limit: int, uploaders: int = 8) -> None:
        self.remote = remote
        self.shared = remote.shared
        self.prefix = remote.prefix  # keys end up in the remote store
        self.limit = limit
        root = Path(stage_dir)
        if not root.is_dir():
            raise BackendError(f"stage_dir {stage_dir}: no such directory")
        self._claim(root)
        make_private_dirs(root / "objects")
        for directory in (root, root / "objects"):  # a stage made by an earlier nvfs may be open to all
            os.chmod(directory, DIRECTORY_MODE)
        self.stage = DirectoryBackend(str(root / "objects"))
        self._cond = threading.Condition()
        self._queue: OrderedDict[str, int] = OrderedDict()  # key -> staged size, in put order
        self._uploading: set[str] = set()
        # Prefixes a directory rename is moving in the remote store: staged objects under them
        # wait, or the remote copy of an older version would land on top of their upload.
        self._moving: set[str] = set()
        self._generation: dict[str, int] = {}  # bumped by every put or delete of a staged key
        self._staged_bytes = 0
        self._failures = 0
        self._closing = False
        self._last_put = 0.0  # time.monotonic() of the last put
        self._uploaders = uploaders
        self._threads: list[threading.Thread] = []

    def _claim(self, root: Path) -> None:
        """A stage belongs to one store: refuse one that holds another store's objects."""
        marker = root / STAGE_MARKER
        mine = {"remote": self.remote.describe()}
        if marker.exists():
            try:
                owner = json.loads(marker.read_text())
            except (OSError, ValueError) as exc:
                raise BackendError(f"stage_dir {root}: {STAGE_MARKER} is unreadable: {exc}") from None
            if owner != mine:
                remote = owner.get("remote") if isinstance(owner, dict) else owner
                raise BackendError(f"stage_dir {root} belongs to another store ({remote})")
        elif any(root.iterdir()):
            raise BackendError(f"stage_dir {root} is not empty and is not an nvfs stage")
        else:
            write_private(marker, json.dumps(mine).encode())

    def describe(self) -> str:
        return self.remote.describe()

    def lock(self) -> None:
        self.stage.lock()
        self.remote.lock()
        self._resume()

    def start_background(self) -> None:
        # Made here, in the daemon: a Thread object made before the fork to the background
        # and started after it reports is_alive() False, and close() would not wait for it.
        self._threads = [threading.Thread(target=self._drain, name=f"nvfs-upload-{n}", daemon=True)
                         for n in range(self._uploaders)]
        for thread in self._threads:
            thread.start()

    def _resume(self) -> None:
        """Queue what an earlier daemon staged but did not upload: chunks first, then the rest."""
        staged = sorted(self.stage.iter_objects(""),
                        key=lambda listed: (not listed.key.startswith(_CHUNKS), listed.modified))
        for listed in staged:
            self._queue[listed.key] = os.path.getsize(self.stage.root / listed.key)
            self._staged_bytes += self._queue[listed.key]
        if staged:
            log.info("stage holds %d objects (%d bytes) not yet uploaded: uploading", len(staged),
                     self._staged_bytes)

    # ----- writes ---------------------------------------------------------------------------

    def put(self, key: str, data: bytes, *, durable: bool) -> None:
        self.put_parts(key, (data,), durable=durable)

    def put_parts(self, key: str, parts: Sequence[Buffer], *, durable: bool) -> None:
        size = sum(memoryview(part).nbytes for part in parts)
        with self._cond:
            self._cond.wait_for(lambda: self._staged_bytes + size <= self.limit or not self._queue)
            self._unqueue(key)
            self.stage.put_parts(key, parts, durable=durable)
            self._queue[key] = size
            self._staged_bytes += size
            self._generation[key] = self._generation.get(key, 0) + 1
            self._last_put = time.monotonic()
            self._cond.notify_all()

    def _unqueue(self, key: str) -> None:
        size = self._queue.pop(key, None)
        if size is not None:
            self._staged_bytes -= size

    def delete(self, key: str) -> None:
        with self._cond:
            self._cond.wait_for(lambda: key not in self._uploading)
            self._unqueue(key)
            self._generation[key] = self._generation.get(key, 0) + 1
            self.stage.delete(key)
            self._cond.notify_all()
        self.remote.delete(key)

    def rename(self, src: str, dst: str) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._uploading & {src, dst})
            if src in self._queue:
                self._unqueue(dst)
                self.stage.delete(dst)
                self.stage.rename(src, dst)
                self._queue[dst] = self._queue.pop(src)
                for key in (src, dst):
                    self._generation[key] = self._generation.get(key, 0) + 1
                staged = True
            else:
                staged = False
        if staged:
            self.remote.delete(src)  # an older uploaded version; the staged one follows as dst
        else:
            self.remote.rename(src, dst)

    def rename_prefix(self, src: str, dst: str) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not any(key.startswith(src) for key in self._uploading))
            moved = [key for key in self._queue if key.startswith(src)]
            self.stage.rename_prefix(src, dst)
            for key in moved:
                self._queue[dst + key[len(src):]] = self._queue.pop(key)
            self._moving.add(dst)
        try:
            self.remote.rename_prefix(src, dst)
        finally:
            with self._cond:
                self._moving.discard(dst)
                self._cond.notify_all()

    def sync(self) -> None:
        self.stage.sync()

    # ----- reads ----------------------------------------------------------------------------

    def get(self, key: str, *, content_addressed: bool = False) -> bytes | memoryview:
        try:
            return self.stage.get(key)
        except ObjectNotFound:
            return self.remote.get(key, content_addressed=content_addressed)

    def chunk_request(self, key: str, *, wait: bool = True) -> ObjectGet | None:
        return None if self.stage.exists(key) else self.remote.chunk_request(key, wait=wait)

    def exists(self, key: str) -> bool:
        return self.stage.exists(key) or self.remote.exists(key)

    def list_dir(self, prefix: str) -> tuple[dict[str, str], list[str]]:
        local_objects, local_prefixes = self.stage.list_dir(prefix)
        remote_objects, remote_prefixes = self.remote.list_dir(prefix)
        staged = {name: "staged-" + version for name, version in local_objects.items()}
        return {**remote_objects, **staged}, sorted({*local_prefixes, *remote_prefixes})

    def iter_objects(self, prefix: str) -> Iterator[ListedObject]:
        seen: set[str] = set()
        for listed in self.stage.iter_objects(prefix):
            seen.add(listed.key)
            yield listed._replace(version="staged-" + listed.version)
        for listed in self.remote.iter_objects(prefix):
            if listed.key not in seen:
                yield listed

    def is_empty(self) -> bool:
        return self.stage.is_empty() and self.remote.is_empty()

    def capacity(self) -> tuple[int, int] | None:
        return self.remote.capacity()

    def discard_incomplete(self) -> None:
        self.stage.discard_incomplete()
        self.remote.discard_incomplete()

    # ----- draining ----------------------------------------------------------------------------

    def _next_upload(self) -> str | None:
        """The first queued key that may go now: a chunk, or anything with nothing before it."""
        for position, key in enumerate(self._queue):
            if key in self._uploading or any(key.startswith(prefix) for prefix in self._moving):
                continue
            if key.startswith(_CHUNKS) or (position == 0 and not self._uploading):
                return key
            if not key.startswith(_CHUNKS):
                return None  # a manifest waits for everything staged before it
        return None

    def _writers_first(self) -> bool:
        """Whether uploads should wait for writers that are staging data right now.

        A save (the GPUs idle behind it) gets the CPU, disk and network first; the drain
        starts once writers have been quiet for ``_WRITERS_QUIET`` seconds, or at once when
        the stage is half full or the daemon is exiting.
        """
        return (not self._closing and self._staged_bytes <= self.limit // 2
                and time.monotonic() - self._last_put < _WRITERS_QUIET)

    def _drain(self) -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _UPLOADER_NICENESS)
        while True:
            with self._cond:
                while True:
                    key = None if self._writers_first() else self._next_upload()
                    if key is not None:
                        break
                    if self._closing and not self._queue:
                        return
                    self._cond.wait(timeout=_WRITERS_QUIET if self._queue else None)
                self._uploading.add(key)
                generation = self._generation.get(key, 0)
            try:
                self._upload(key, generation)
            finally:
                with self._cond:
                    self._uploading.discard(key)
                    self._cond.notify_all()

    def _upload(self, key: str, generation: int) -> None:
        try:
            self.remote.put(key, self.stage.get(key), durable=True)
        except ObjectNotFound:
            return  # deleted meanwhile
        except BackendError as exc:
            delay = _RETRY_SECONDS[min(self._failures, len(_RETRY_SECONDS) - 1)]
            self._failures += 1
            log.warning("uploading %s failed (retrying in %ds): %s", key, delay, exc)
            time.sleep(delay)
            return
        self._failures = 0
        with self._cond:
            if self._generation.get(key, 0) == generation and key in self._queue:
                self._unqueue(key)
                self.stage.delete(key)
                self._generation.pop(key, None)

    def close(self) -> None:
        """Upload everything still staged, then release both stores."""
        with self._cond:
            self._closing = True
            if self._queue:
                log.info("uploading %d staged objects (%d bytes) before exit", len(self._queue),
                         self._staged_bytes)
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()
        self.stage.close()
        self.remote.close()

