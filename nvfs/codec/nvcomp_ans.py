"""nvCOMP's ANS through its batched C API (libnvcomp, called with ctypes): nothing waits.

nvCOMP's Python ``Codec`` waits for its CUDA stream inside each call, holding the GIL: its
encode hands back the coded sizes as a host list, and its decode parses the frame headers
first. Queued behind other GPU work, either call returns only once that work is done, and
the other Python threads crawl meanwhile: the GPU engine could not lay out one batch while
the GPU coded another. The C API takes device arrays of frame pointers and sizes and only queues
work; coded sizes, decoded sizes and statuses land in device memory, for the host to read
once it needs them. The bitstream is the one the Python ``Codec`` writes, byte for byte (a GPU
test compares them), so chunks written before this module decode alike.
"""

from __future__ import annotations

import ctypes

import cupy as cp
import numpy as np

try:
    from nvidia.libnvcomp import load_library
except ImportError as exc:  # pragma: no cover - depends on the machine
    raise ImportError(f"the GPU engine needs nvidia-libnvcomp (pip install nvfs[cu13]): {exc}") from exc

from nvfs.codec.base import CodecError
from nvfs.codec.device_tables import TableUploads, aligned

_TYPE_UCHAR = 1  # nvcompType_t: what the Python Codec's data_type="|u1" writes
_TYPE_FROM_STREAM = 0xFF  # NVCOMP_TYPE_BITS: a decoder reads the type from each frame
_SIZE, _POINTER = ctypes.c_size_t, ctypes.c_void_p


class _CompressOpts(ctypes.Structure):
    """``nvcompBatchedANSCompressOpts_t`` (64 bytes; reserved bytes zero)."""

    _fields_ = [("type", ctypes.c_int), ("data_type", ctypes.c_int),
                ("max_sub_chunk_count", ctypes.c_uint8), ("states_per_lane", ctypes.c_uint8),
                ("histogram_reduction_log2", ctypes.c_uint8), ("reserved", ctypes.c_char * 53)]


class _DecompressOpts(ctypes.Structure):
    """``nvcompBatchedANSDecompressOpts_t`` (64 bytes; reserved bytes zero)."""

    _fields_ = [("backend", ctypes.c_int), ("data_type", ctypes.c_int),
                ("max_sub_chunk_count", ctypes.c_uint8), ("states_per_lane", ctypes.c_uint8),
                ("skip_validate", ctypes.c_uint8), ("reserved", ctypes.c_char * 53)]


def _load() -> ctypes.CDLL:
    library = load_library()
    if library is None:
        raise CodecError("libnvcomp.so.6 (the nvidia-libnvcomp package) cannot be loaded")
    size, pointer, size_out = _SIZE, _POINTER, ctypes.POINTER(_SIZE)
    signatures = {  # nvcompBatchedANS<name>, from nvcomp/ans.h
        "CompressGetMaxOutputChunkSize": [size, _CompressOpts, size_out],
        "CompressGetTempSize": [size, size, _CompressOpts, size_out, size, pointer],
        "CompressAsync": [pointer, pointer, size, size, pointer, size, pointer, pointer, _CompressOpts,
                          pointer, pointer],
        "DecompressGetTempSize": [size, size, _DecompressOpts, size_out, size, pointer],
        "DecompressAsync": [pointer, pointer, pointer, pointer, size, pointer, size, pointer, _DecompressOpts,
                            pointer, pointer],
    }
    for name, arguments in signatures.items():
        function = getattr(library, "nvcompBatchedANS" + name)
        function.argtypes, function.restype = arguments, ctypes.c_int
    return library


_CHECK_FRAMES = cp.RawKernel(r"""
// Count the frames that did not decode cleanly to their expected size.
extern "C" __global__ void check_frames(const int* status, const unsigned long long* decoded,
                                        const unsigned long long* expected, long long frames, int* bad) {
    long long f = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (f < frames && (status[f] != 0 || decoded[f] != expected[f])) atomicAdd(bad, 1);
}
""", "check_frames")


class AnsFrames:
    """Codes and decodes frames with nvCOMP's ANS on one stream, queuing work only.

    Device buffers handed in must stay alive until the stream has run the work (allocations
    from CuPy's pool on the same stream are: memory freed is reused only by later work).
    """

    def __init__(self, stream: cp.cuda.Stream, tables: TableUploads, largest_frame: int) -> None:
        self._library = _load()
        self._stream = stream
        self._tables = tables
        self._compress_opts = _CompressOpts(data_type=_TYPE_UCHAR)
        self._decompress_opts = _DecompressOpts(data_type=_TYPE_FROM_STREAM)
        bound = _SIZE()
        self._call("CompressGetMaxOutputChunkSize", largest_frame, self._compress_opts, ctypes.byref(bound))
        self.capacity = aligned(bound.value)  # bytes a coded frame may take, at most

    def encode(self, source: cp.ndarray, starts: np.ndarray, sizes: np.ndarray,
               output: cp.ndarray) -> cp.ndarray:
        """Queue the coding of frames ``source[starts[i]:][:sizes[i]]`` to ``output`` at
        ``i * capacity``; returns the device array (uint64) their coded lengths go to."""
        count = len(starts)
        pointers, lengths, out_pointers = self._tables.upload(
            _addresses(source, starts), sizes.astype(np.uint64),
            _addresses(output, np.arange(count) * self.capacity))
        largest, total = int(sizes.max()), int(sizes.sum())
        temp = self._temp("CompressGetTempSize", count, largest, self._compress_opts, total)
        coded = cp.empty(count, dtype=cp.uint64)
        self._call("CompressAsync", pointers.data.ptr, lengths.data.ptr, largest, count, temp.data.ptr,
                   temp.size, out_pointers.data.ptr, coded.data.ptr, self._compress_opts, None,
                   self._stream.ptr)
        return coded

    def decode(self, source: cp.ndarray, starts: np.ndarray, lengths: np.ndarray, target: cp.ndarray,
               target_starts: np.ndarray, sizes: np.ndarray) -> cp.ndarray:
        """Queue the decoding of frames (``lengths[i]`` bytes at ``source[starts[i]]``, each
        starting 16-byte aligned) to ``sizes[i]`` bytes at ``target[target_starts[i]]``.

        Returns a device counter (int32) of frames that failed or decoded to another size.
        """
        count = len(starts)
        pointers, coded_lengths, expected, out_pointers = self._tables.upload(
            _addresses(source, starts), lengths.astype(np.uint64), sizes.astype(np.uint64),
            _addresses(target, target_starts))
        temp = self._temp("DecompressGetTempSize", count, int(sizes.max()), self._decompress_opts,
                          int(sizes.sum()))
        decoded = cp.empty(count, dtype=cp.uint64)
        statuses = cp.empty(count, dtype=cp.int32)
        self._call("DecompressAsync", pointers.data.ptr, coded_lengths.data.ptr, expected.data.ptr,
                   decoded.data.ptr, count, temp.data.ptr, temp.size, out_pointers.data.ptr,
                   self._decompress_opts, statuses.data.ptr, self._stream.ptr)
        bad = cp.zeros(1, dtype=cp.int32)
        _CHECK_FRAMES((-(-count // 256),), (256,), (statuses, decoded, expected, np.int64(count), bad))
        return bad

    def _temp(self, name: str, count: int, largest: int, opts, total: int) -> cp.ndarray:
        """Scratch memory for one call (from the pool, so the same block comes back each time)."""
        size = _SIZE()
        self._call(name, count, largest, opts, ctypes.byref(size), total, self._stream.ptr)
        return cp.empty(max(size.value, 1), dtype=cp.uint8)

    def _call(self, name: str, *arguments) -> None:
        status = getattr(self._library, "nvcompBatchedANS" + name)(*arguments)
        if status != 0:
            raise CodecError(f"nvCOMP nvcompBatchedANS{name} failed with status {status}")


def _addresses(buffer: cp.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Device addresses of ``buffer`` at byte offsets, as uint64 for a pointer table."""
    return np.uint64(buffer.data.ptr) + offsets.astype(np.uint64)
