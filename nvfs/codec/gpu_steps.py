"""Device steps that the GPU engine's encode and decode sides share.

Host buffers go to the device and back through one pinned staging buffer; kernels run on the
engine's one CUDA stream, so each step is ordered after the ones queued before it, and the host
waits only where it needs a result (:meth:`DeviceSteps._wait`, without the GIL). The plane
kernels and the segment copy are ``plane_kernels.cu``.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources

import cupy as cp
import numpy as np

from nvfs.codec.device_tables import TableUploads
from nvfs.codec.gpu_layout import BatchLayout

_THREADS = 256
COPY_PIECE = 64 << 10  # bytes one block of the copy kernel moves at most

_GROUP = 16  # values per thread in the plane kernels: one 16-byte store per plane


def plane_kernel_source() -> str:
    """The CUDA source of ``plane_kernels.cu``, with its ``GROUP`` defined."""
    source = resources.files("nvfs.codec").joinpath("plane_kernels.cu").read_text()
    return f"#define GROUP {_GROUP}\n" + source


class DeviceSteps:
    """Transfers, kernel launches and copies on the engine's stream; one thread at a time.

    A base of :class:`nvfs.codec.gpu.GpuEngine`, which sets these attributes up on its
    dispatcher thread (``GpuEngine._setup``).
    """

    _stream: cp.cuda.Stream
    _done: cp.cuda.Event
    _tables: TableUploads
    _copy: cp.RawKernel
    _copiers: ThreadPoolExecutor
    _pinned: np.ndarray

    def _upload(self, buffers: Sequence[memoryview], reserve: int) -> cp.ndarray:
        """Copy host buffers back to back into device memory through the pinned staging buffer.

        The buffer is grown first to ``reserve`` bytes as well, the most the batch will download,
        so that it is never replaced while the copy to the device may still be running.
        """
        total = sum(len(buffer) for buffer in buffers)
        staging = self._staging(max(total, reserve))
        starts = np.cumsum([0] + [len(buffer) for buffer in buffers]).tolist()

        def copy_in(index: int) -> None:
            staging[starts[index] : starts[index + 1]] = np.frombuffer(buffers[index], dtype=np.uint8)

        list(self._copiers.map(copy_in, range(len(buffers))))
        device = cp.empty(total, dtype=cp.uint8)
        device.set(staging[:total], stream=self._stream)
        return device

    def _download(self, device: cp.ndarray) -> np.ndarray:
        """Copy a device buffer into the pinned staging buffer and wait for it."""
        staging = self._staging(device.size)[: device.size]
        device.get(stream=self._stream, out=staging)
        self._wait()
        return staging

    def _copy_out(self, host: np.ndarray, bounds: Sequence[int]) -> list[memoryview]:
        """Copies of ``host[bounds[i]:bounds[i + 1]]`` (the staging buffer is reused by the next batch)."""

        def copy(index: int) -> memoryview:
            part = np.empty(bounds[index + 1] - bounds[index], dtype=np.uint8)  # no zero fill
            part[:] = host[bounds[index] : bounds[index + 1]]
            return memoryview(part)

        return list(self._copiers.map(copy, range(len(bounds) - 1)))

    def _wait(self) -> None:
        """Wait for the work queued on the engine's stream, with the GIL released.

        Waiting while holding the GIL (as reading nvCOMP's output sizes or a stream sync may
        do) stalls every other thread of the daemon, the FUSE thread included, for as long
        as the GPU works.
        """
        self._done.record(self._stream)
        self._done.synchronize()

    def _staging(self, size: int) -> np.ndarray:
        """The pinned host buffer, grown to ``size`` bytes (reused: one batch at a time)."""
        if self._pinned.size < size:
            memory = cp.cuda.alloc_pinned_memory(max(size, 2 * self._pinned.size))
            self._pinned = np.frombuffer(memory, dtype=np.uint8)
        return self._pinned

    def _launch(self, kernel, source: cp.ndarray, target: cp.ndarray, layout: BatchLayout) -> None:
        if layout.values == 0:
            return
        blocks = -(-layout.values // (_THREADS * _GROUP))
        regions = np.int32(len(layout.tables[0]))
        kernel((blocks,), (_THREADS,), (source, target, *layout.tables, regions, np.int64(layout.values)))


    def _fetch(self, device: cp.ndarray) -> tuple[np.ndarray, cp.cuda.Event]:
        """Queue a copy of a small device array to pinned host memory: the host array, valid once
        the returned event has happened (waiting on it does not wait for work queued later)."""
        memory = cp.cuda.alloc_pinned_memory(max(device.nbytes, 1))
        host = np.frombuffer(memory, dtype=device.dtype, count=device.size)
        device.get(stream=self._stream, out=host, blocking=False)
        done = cp.cuda.Event(block=True, disable_timing=True)  # block: wait without the GIL
        done.record(self._stream)
        return host, done

    def _copy_segments(self, *moves: tuple[cp.ndarray, cp.ndarray, object]) -> None:
        """Copy segments in one kernel: each move is a source buffer, a target buffer and rows of
        (source offset, target offset, length) between them."""
        rows = [np.asarray(segments, dtype=np.int64).reshape(-1, 3) + (source.data.ptr, target.data.ptr, 0)
                for source, target, segments in moves if len(segments)]
        if not rows:
            return
        table = _copy_pieces(np.concatenate(rows))
        pieces = table.shape[1]
        (device_table,) = self._tables.upload(table)
        self._copy((pieces,), (_THREADS,), (device_table, np.int32(pieces)))


def _copy_pieces(segments: np.ndarray) -> np.ndarray:
    """Rows (source, target, length) cut into pieces of at most :data:`COPY_PIECE` bytes.

    Returns the kernel's table: sources, targets and lengths of the pieces, as three rows.
    """
    lengths = segments[:, 2]
    counts = np.maximum(-(-lengths // COPY_PIECE), 1)
    owner = np.repeat(np.arange(len(segments)), counts)
    skip = (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)) * COPY_PIECE
    return np.stack((segments[owner, 0] + skip, segments[owner, 1] + skip,
                     np.minimum(lengths[owner] - skip, COPY_PIECE)))
