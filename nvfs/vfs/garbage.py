"""Garbage collection of the store's unreferenced chunks, in the background, on request."""

from __future__ import annotations

import logging

import trio

from nvfs.store import Store
from nvfs.vfs.workers import Workers

log = logging.getLogger(__name__)


class GarbageCollector:
    """Runs one collection pass per burst of requests; a pass serves every request made before it began."""

    def __init__(self, store: Store, workers: Workers) -> None:
        self._store = store
        self._workers = workers
        self._wanted = trio.Event()
        self._requested = 0
        self._served = 0
        self._pass_done = trio.Event()

    def request(self) -> None:
        """Chunks may have lost their last reference: collect them soon."""
        self._requested += 1
        self._wanted.set()

    async def run(self) -> None:
        """Delete unreferenced chunks in the background, one pass per burst of requests."""
        while True:
            await self._wanted.wait()
            self._wanted = trio.Event()
            requested = self._requested
            try:
                await self._workers.run(self._store.collect_garbage, lane=self._workers.chunk_lane)
            except Exception as exc:
                log.error("garbage collection failed (nothing was deleted): %s", exc)
            finally:
                self._served = requested
                self._pass_done.set()
                self._pass_done = trio.Event()

    async def wait_served(self) -> None:
        """Return once a pass has served every request made so far (unmount)."""
        while self._served < self._requested:
            await self._pass_done.wait()
