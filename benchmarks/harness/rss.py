"""A daemon's memory over a run: VmRSS sampled in a thread from mount until the daemon exits.

A sampled peak can miss a short spike between samples; the scenarios report the kernel's own
high-water mark (VmHWM) beside it for that reason.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from nvfs.testing.procfs import rss_with_write_processes, tree_status

INTERVAL = 0.2  # seconds between samples: a 1 GiB/s writer moves 200 MiB in between


def rss_with_fetch_processes(pid: int) -> int | None:
    """VmRSS of a daemon plus its fetch processes' (their memfds are counted once: procfs.tree_status)."""
    return tree_status(pid, "VmRSS")


class RssSampler:
    """Peak of ``measure(pid)`` (bytes), sampled every :data:`INTERVAL` s in a thread until the process exits.

    ``measure`` is :func:`rss_with_fetch_processes` for a reading daemon and
    :func:`~nvfs.testing.procfs.rss_with_write_processes` (the default) for a writing one. Set
    ``phase`` to name what runs now: the peak remembers the phase it was sampled in.
    """

    def __init__(self, pid: int, measure: Callable[[int], int | None] = rss_with_write_processes) -> None:
        self.pid, self.measure = pid, measure
        self.phase = "start"
        self.peak = 0
        self.peak_phase = ""
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{pid}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            rss = self.measure(self.pid)
            if rss is None:
                return
            self.samples += 1
            if rss > self.peak:
                self.peak, self.peak_phase = rss, self.phase
            if self._stop.wait(INTERVAL):
                return

    def stop(self) -> int:
        """Stop sampling; returns the peak."""
        self._stop.set()
        self._thread.join(timeout=5)
        return self.peak
