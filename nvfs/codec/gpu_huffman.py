"""Huffman-only zstd frames made on the GPU: the portable format at GPU speed.

nvCOMP's Zstd compresses float exponent planes at a few GB/s, searching for matches that
such planes do not have; what zstd gains on them comes from its Huffman stage alone. The
kernels in ``zstd_huffman.cu`` count each frame's bytes, build one Huffman table per plane
and code every frame as one standard zstd frame of Huffman-coded literals (an RLE frame
for one repeated byte, a raw one where coding does not pay). Any zstd decoder reads them.

A plane whose table has no zstd description (practically never: see ``huffman_table``) is
stored as raw frames.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import cupy as cp
import numpy as np

from nvfs.codec.device_tables import TableUploads, aligned
from nvfs.codec.frames import Frames

_THREADS = 256
_TABLE_THREADS = 32
_DESCRIPTION_STRIDE = 144  # these two must match DESCRIPTION_STRIDE and LANES in zstd_huffman.cu
_LANES = 64
_DECODE_SLOTS = 8  # frames per block of decode_frames (four threads each), as DECODE_SLOTS in the .cu
FRAME_DECODED, FRAME_UNSUPPORTED, FRAME_DAMAGED = 0, 1, 2  # decode statuses, as in zstd_huffman.cu
# Decoded bytes per frame this engine writes: a quarter of the CPU engine's. Each of a frame's
# four streams is one thread's chain of dependent steps, so more, smaller frames decode
# faster, until a batch has more frames than the GPU runs at once; each frame costs its
# headers, a few bytes, so smaller frames also store a little more. Readers take any frame
# size (docs/FORMAT.md).
GPU_FRAME_SIZE = 32 << 10
FRAME_CAPACITY = aligned(GPU_FRAME_SIZE + 64)  # the largest frame: raw, 12 bytes of headers and the bytes


@dataclass
class Counts:
    """Byte counts of a batch's frames and planes, on the device, and a summary of each plane."""

    frames: cp.ndarray  # (frames, 256) uint32
    planes: cp.ndarray  # (planes, 256) uint32
    entropy: cp.ndarray  # (planes,) float32: order-0 entropy in bits per byte


class HuffmanFrames:
    """The kernels of ``zstd_huffman.cu``, run on the caller's CUDA stream; nothing is waited for."""

    def __init__(self, tables: TableUploads) -> None:
        self._tables = tables  # on the caller's stream
        source = resources.files("nvfs.codec").joinpath("zstd_huffman.cu").read_text()
        module = cp.RawModule(code=source)
        self._histograms = module.get_function("frame_histograms")
        self._plane_counts = module.get_function("plane_counts")
        self._build = module.get_function("build_tables")
        self._encode = module.get_function("encode_frames")
        self._decode = module.get_function("decode_frames")

    def count(self, planes: cp.ndarray, frames: Frames, bounds: np.ndarray) -> Counts:
        """Count the bytes of every frame and plane (plane ``p`` has frames ``bounds[p]:bounds[p + 1]``)."""
        plane_count = len(bounds) - 1
        counts = Counts(cp.empty((len(frames.start), 256), dtype=cp.uint32),
                        cp.empty((plane_count, 256), dtype=cp.uint32),
                        cp.empty(plane_count, dtype=cp.float32))
        start, size, plane_bounds = self._tables.upload(frames.start, frames.size.astype(np.int32), bounds)
        if len(frames.start):
            self._histograms((len(frames.start),), (_THREADS,), (planes, start, size, counts.frames))
        self._plane_counts((plane_count,), (256,),
                           (counts.frames, plane_bounds, counts.planes, counts.entropy))
        return counts

    def encode(self, planes: cp.ndarray, frames: Frames, frame_index: np.ndarray, counts: Counts,
               chosen: np.ndarray) -> tuple[cp.ndarray, cp.ndarray]:
        """Code ``frames`` (rows ``frame_index`` of the counts), all of planes ``chosen`` (ascending).

        Returns the output, frame ``i`` at ``i * FRAME_CAPACITY``, and each frame's length
        (uint32, on the device).
        """
        count, tables = len(frames.start), len(chosen)
        table = cp.empty((tables, 256), dtype=cp.uint32)
        descriptions = cp.empty((tables, _DESCRIPTION_STRIDE), dtype=cp.uint8)
        description_length = cp.empty(tables, dtype=cp.int32)
        chosen_planes, start, size, index, frame_table = self._tables.upload(
            chosen.astype(np.int32), frames.start, frames.size.astype(np.int32), frame_index.astype(np.int64),
            np.searchsorted(chosen, frames.plane).astype(np.int32))
        self._build((-(-tables // _TABLE_THREADS),), (_TABLE_THREADS,),
                    (counts.planes, chosen_planes, np.int32(tables), table, descriptions, description_length))
        out = cp.empty(count * FRAME_CAPACITY, dtype=cp.uint8)
        frame_length = cp.empty(count, dtype=cp.uint32)
        self._encode((count,), (4 * _LANES,),
                     (planes, start, size, index, counts.frames, frame_table, table,
                      descriptions, description_length, out, np.int64(FRAME_CAPACITY), frame_length))
        return out, frame_length

    def decode(self, frames: cp.ndarray, start: np.ndarray, length: np.ndarray, out: cp.ndarray,
               target: np.ndarray, size: np.ndarray) -> cp.ndarray:
        """Decode the zstd frames at ``frames[start:start + length]`` into ``out[target:target + size]``.

        Returns each frame's status (int32, on the device): :data:`FRAME_DECODED`,
        :data:`FRAME_UNSUPPORTED` (a valid frame of another shape, left for another decoder)
        or :data:`FRAME_DAMAGED`.
        """
        status = cp.empty(len(start), dtype=cp.int32)
        blocks = -(-len(start) // _DECODE_SLOTS)
        tables = self._tables.upload(start.astype(np.int64), length.astype(np.int32), target.astype(np.int64),
                                     size.astype(np.int32))
        self._decode((blocks,), (4 * _DECODE_SLOTS,),
                     (frames, tables[0], tables[1], out, tables[2], tables[3], status, np.int32(len(start))))
        return status
