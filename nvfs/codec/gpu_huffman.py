"""Huffman-only zstd frames made on the GPU: the portable format at GPU speed.

nvCOMP's Zstd compresses float exponent planes at a few GB/s, searching for matches that
such planes do not have; what zstd gains on them comes from its Huffman stage alone. The
kernels in ``zstd_huffman.cu`` count each frame's bytes, build one Huffman table per plane
and code every frame as one standard zstd frame of Huffman-coded literals (an RLE frame
for one repeated byte, a raw one where coding does not pay). Any zstd decoder reads them.

Planes this coder cannot describe — a byte value above 128 occurs (zstd's direct weight
format stops there) — go to nvCOMP's Zstd instead; see :meth:`HuffmanFrames.codes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import cupy as cp
import numpy as np

from nvfs.codec.planes import FRAME_SIZE

_THREADS = 256
_TABLE_THREADS = 32
_DESCRIPTION_STRIDE = 80  # must match DESCRIPTION_STRIDE in zstd_huffman.cu
_DIRECT_SYMBOLS = 129  # byte values 0..128: what the direct weight format describes
_ALIGN = 256


def _aligned(size: int) -> int:
    return -(-size // _ALIGN) * _ALIGN


STREAM_CAPACITY = _aligned(-(-FRAME_SIZE // 4) * 11 // 8 + 8)  # 11-bit codes at most, plus the end
FRAME_CAPACITY = _aligned(FRAME_SIZE + 64)  # a raw frame: 12 bytes of headers and the bytes


@dataclass
class Frames:
    """Frames of a plane buffer: start and size of each, and the plane each belongs to."""

    start: np.ndarray  # int64
    size: np.ndarray  # int64
    plane: np.ndarray  # int64, ascending

    def subset(self, chosen: np.ndarray) -> Frames:
        return Frames(self.start[chosen], self.size[chosen], self.plane[chosen])


class HuffmanFrames:
    """The kernels of ``zstd_huffman.cu``, run on one CUDA stream (the caller's)."""

    def __init__(self) -> None:
        source = resources.files("nvfs.codec").joinpath("zstd_huffman.cu").read_text()
        module = cp.RawModule(code=source)
        self._histograms = module.get_function("frame_histograms")
        self._build = module.get_function("build_tables")
        self._encode = module.get_function("encode_streams")
        self._assemble = module.get_function("assemble_frames")

    def histograms(self, planes: cp.ndarray, frames: Frames) -> cp.ndarray:
        """Byte counts of every frame, one row of 256 per frame (on the device)."""
        counts = cp.empty((len(frames.start), 256), dtype=cp.uint32)
        if len(frames.start):
            start, size = cp.asarray(frames.start), cp.asarray(frames.size, dtype=cp.int32)
            self._histograms((len(frames.start),), (_THREADS,), (planes, start, size, counts))
        return counts

    @staticmethod
    def codes(plane_counts: np.ndarray) -> np.ndarray:
        """Which planes (rows of byte counts) this coder takes: one byte value, or none above 128."""
        present = plane_counts > 0
        highest = 255 - np.argmax(present[:, ::-1], axis=1)
        return (present.sum(axis=1) == 1) | (highest < _DIRECT_SYMBOLS)

    def encode(self, planes: cp.ndarray, frames: Frames, frame_counts: np.ndarray,
               plane_counts: np.ndarray) -> tuple[cp.ndarray, cp.ndarray]:
        """Code ``frames`` (whose planes :meth:`codes` takes; counts per frame and per plane).

        Returns the output, frame ``i`` at ``i * FRAME_CAPACITY``, and each frame's length
        (uint32, on the device); nothing is waited for.
        """
        count = len(frames.start)
        tables, table_of_frame = np.unique(frames.plane, return_inverse=True)
        distinct = np.count_nonzero(frame_counts, axis=1)
        symbol = np.where(distinct == 1, np.argmax(frame_counts, axis=1), -1).astype(np.int32)
        start, size = cp.asarray(frames.start), cp.asarray(frames.size, dtype=cp.int32)
        table_index, symbol = cp.asarray(table_of_frame.astype(np.int32)), cp.asarray(symbol)
        table = cp.empty((len(tables), 256), dtype=cp.uint32)
        descriptions = cp.empty((len(tables), _DESCRIPTION_STRIDE), dtype=cp.uint8)
        description_length = cp.empty(len(tables), dtype=cp.int32)
        self._build((-(-len(tables) // _TABLE_THREADS),), (_TABLE_THREADS,),
                    (cp.asarray(plane_counts[tables].astype(np.uint32)), np.int32(len(tables)), table,
                     descriptions, description_length))
        streams = cp.empty(4 * count * STREAM_CAPACITY, dtype=cp.uint8)
        stream_length = cp.empty(4 * count, dtype=cp.uint32)
        self._encode((-(-4 * count // _THREADS),), (_THREADS,),
                     (planes, start, size, table_index, symbol, table, streams, np.int64(STREAM_CAPACITY),
                      stream_length, np.int32(count)))
        out = cp.empty(count * FRAME_CAPACITY, dtype=cp.uint8)
        frame_length = cp.empty(count, dtype=cp.uint32)
        self._assemble((count,), (_THREADS,),
                       (planes, start, size, table_index, symbol, descriptions, description_length,
                        streams, np.int64(STREAM_CAPACITY), stream_length, out, np.int64(FRAME_CAPACITY),
                        frame_length))
        return out, frame_length
