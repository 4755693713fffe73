"""Where vfs work runs besides the request handlers: worker threads in two lanes, and background tasks.

Request handlers run on the trio thread and must not block it: store calls go to worker
threads, and work nobody waits for (uploads, read-ahead, background commits) to tasks in
the daemon's nursery.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from nvfs.store import ChunkUnreadable, StoreUnavailable
from nvfs.vfs.errors import VfsError, store_errno

log = logging.getLogger(__name__)

# Worker threads for namespace and metadata calls of the store (list, write and delete entries),
# apart from the ``threads`` that fetch and store chunks: read-ahead fetches held up by a stalled
# store may hold every chunk worker, and ``ls`` of the mount must not wait behind them.
NAMESPACE_THREADS = 4


class Workers:
    """The worker-thread lanes of a mount and the nursery its background tasks run in."""

    def __init__(self, chunk_threads: int) -> None:
        self.chunk_lane = trio.CapacityLimiter(chunk_threads)  # chunk fetches, uploads, GC
        self.namespace_lane = trio.CapacityLimiter(NAMESPACE_THREADS)
        self._nursery: trio.Nursery | None = None

    def start(self, nursery: trio.Nursery) -> None:
        """Run background tasks in ``nursery`` from now on."""
        self._nursery = nursery

    def start_soon(self, task: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``task(*args)`` in the background; nobody waits for it."""
        assert self._nursery is not None, "the vfs was not started"
        self._nursery.start_soon(task, *args)

    async def run(self, fn: Callable[..., Any], *args: Any, lane: trio.CapacityLimiter | None = None) -> Any:
        """Run blocking store work in a worker thread of ``lane`` (default: the namespace lane).

        A failing backend becomes EIO, or ENOSPC, EDQUOT or EFBIG where it said so.
        """
        try:
            return await trio.to_thread.run_sync(fn, *args, limiter=lane or self.namespace_lane)
        except ChunkUnreadable:
            raise  # the reader reports it with the file and chunk
        except StoreUnavailable as exc:
            log.error("%s failed: %s", getattr(fn, "__name__", fn), exc)
            raise VfsError(store_errno(exc)) from None
