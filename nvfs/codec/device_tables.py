"""Small host tables (offsets, lengths, layouts) sent to the GPU without waiting for them.

``cupy.asarray`` of a numpy array copies from pageable memory, and the host waits for that
copy, which the stream runs only after every kernel queued before it: a batch of the GPU
engine made a dozen such copies, each a stall of the host between kernels. Here the tables
a step needs are packed into a pinned ring buffer and sent in one asynchronous copy.

Also here: the alignment that every buffer the GPU engine lays out in device memory keeps.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

ALIGN = 256  # alignment of planes, frames and tables in device buffers (nvCOMP asks for at most this)
RING_BYTES = 8 << 20  # far more than the tables of one batch


def aligned(size):
    """``size`` (an int or an array of them) rounded up to a multiple of :data:`ALIGN`."""
    return -(-size // ALIGN) * ALIGN


class TableUploads:
    """Copies tables to the device on one stream, through a pinned ring buffer.

    A part of the ring is written again only once the copy that read it is done: the ring
    wraps after waiting for the latest copy, and copies on one stream run in order. The
    device arrays are fresh allocations, so a table lives as long as its array does.
    """

    def __init__(self, stream: cp.cuda.Stream, size: int = RING_BYTES) -> None:
        self._stream = stream
        self._ring = np.frombuffer(cp.cuda.alloc_pinned_memory(size), dtype=np.uint8)
        self._position = 0
        self._latest = cp.cuda.Event(block=True, disable_timing=True)  # block: wait without the GIL
        self._latest.record(stream)  # recorded again after every copy: the latest is all that counts

    def upload(self, *tables: np.ndarray) -> list[cp.ndarray]:
        """Device copies of ``tables``, queued on the stream; the host does not wait."""
        tables = tuple(np.ascontiguousarray(table) for table in tables)
        starts = np.cumsum([0] + [aligned(table.nbytes) for table in tables])
        total = int(starts[-1])
        if total == 0 or total > len(self._ring):
            return [cp.asarray(table) for table in tables]
        if self._position + total > len(self._ring):
            self._latest.synchronize()
            self._position = 0
        packed = self._ring[self._position : self._position + total]
        self._position += total
        device = cp.empty(total, dtype=cp.uint8)
        arrays = []
        for table, start in zip(tables, starts.tolist(), strict=False):
            packed[start : start + table.nbytes] = table.reshape(-1).view(np.uint8)
            array = device[start : start + table.nbytes].view(table.dtype)
            arrays.append(array if table.ndim == 1 else array.reshape(table.shape))
        device.set(packed, stream=self._stream)
        self._latest.record(self._stream)
        return arrays
