"""GPU engine: the plane transform as CUDA kernels (CuPy), entropy coding on the GPU.

It writes the format the CPU engine writes (docs/FORMAT.md, "Transform 1"): regions split
into byte planes, near-random planes stored raw (the CPU engine's entropy test, on whole
planes), the others cut into 32 KiB sub-blocks, each one standard zstd frame. Those frames
come from the kernels of ``zstd_huffman.cu`` (:mod:`nvfs.codec.gpu_huffman`): Huffman-coded
literals and nothing else, which is all that zstd gains on float planes, at tens of GB/s.
A CPU-only machine reads these chunks with the ``zstandard`` package; this engine decodes
frames of that shape with its own kernel and others (the CPU engine's carry a few matches)
with nvCOMP's Zstd. ``codec="ans"`` codes the sub-blocks with nvCOMP's ANS instead: GPU-only.

GPU work is done in batches: the store's worker threads call :meth:`GpuEngine.encode` and
:meth:`GpuEngine.decode` concurrently; each call queues its chunk and waits, and one
dispatcher thread, the only one that touches the GPU, takes every queued chunk (up to a
byte budget) and codes them together — one host-to-device copy through pinned memory, one
kernel per transform step and one launch per coder for all sub-blocks of the batch.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from nvfs.codec.base import Codec, CodecError, ElementKind, Encoded, Region, Transform, item_sizes
from nvfs.codec.cpu import CpuEngine
from nvfs.codec.device_tables import TableUploads, aligned
from nvfs.codec.frames import BatchPlanes, FramedPlane, Frames, frame_table, pack_batch_params, plane_frames
from nvfs.codec.gpu_huffman import (
    FRAME_CAPACITY,
    FRAME_DAMAGED,
    FRAME_DECODED,
    GPU_FRAME_SIZE,
    Counts,
    HuffmanFrames,
)
from nvfs.codec.nvcomp_ans import AnsFrames
from nvfs.codec.planes import (
    FRAME_SIZE,
    RANDOM_BITS,
    RAW_TEST_SAMPLE,
    PlaneCoder,
    RegionEntry,
    check_regions,
    detect_regions,
    parse_params,
    planes_or_raw,
)

log = logging.getLogger(__name__)

try:  # the engine is optional: importing nvfs never needs CUDA (make_engine reports why it is absent)
    import cupy as cp
    from nvidia import nvcomp
except ImportError as exc:  # pragma: no cover - depends on the machine
    raise ImportError(f"the GPU engine needs cupy and nvidia-nvcomp (pip install nvfs[cu13]): {exc}") from exc

# Uncompressed bytes coded per GPU batch at most. A batch costs the host about a millisecond
# of bookkeeping whatever its size, so batches of device data are large: on the H200, ANS at
# 256 MiB per batch ranged from 147 to 241 GB/s over runs (benchmarks/gpu_codec.py). The
# mount's batches are what its workers have in flight, far smaller; the pinned staging buffer
# grows only to the largest host batch seen.
BATCH_BYTES = 512 << 20
# Chunks encoded in device memory: their transform parameters, payloads back to back, payload offsets.
DeviceEncoded = tuple[list[bytes], cp.ndarray, list[int]]
# Chunks to decode in device memory: payloads back to back, payload offsets, parameter tables.
DeviceBatch = tuple[cp.ndarray, Sequence[int], Sequence[Sequence[RegionEntry]]]
# ANS frames carry a table each, and nvCOMP's batched call costs host time per frame: on the
# H200 (.gpu/ansprobe.py, 256 MiB per batch) 512 KiB frames coded bf16 at 1.513x, 134 GB/s and
# decoded at 187 GB/s, where 128 KiB frames gave 1.502x, 108 and 163 GB/s (fp32: 1.204x, 124,
# 169 vs 1.199x, 117, 160); 1 MiB frames were slower again (too few to fill the GPU).
ANS_FRAME_SIZE = 512 << 10
_COPY_THREADS = min(8, os.cpu_count() or 1)
_THREADS = 256
COPY_PIECE = 64 << 10  # bytes one block of the copy kernel moves at most

_GROUP = 16  # values per thread in the plane kernels: one 16-byte store per plane
_KERNELS = f"#define GROUP {_GROUP}\n" + r"""
// Regions of a batch are described by tables indexed by region: its first value's index in
// the batch (ascending), its byte offset in the data, where its planes start in the plane
// buffer and their stride (plane p at plane_offset + p * stride: aligned for nvCOMP), and its
// value size.
__device__ int find_region(const long long* first_value, int regions, long long v) {
    int lo = 0, hi = regions - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (first_value[mid] <= v) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// A value of `size` bytes at `in`, little-endian; one load where the address allows it.
__device__ unsigned long long load_value(const unsigned char* in, int size) {
    unsigned long long address = (unsigned long long)in;
    if (size == 2 && address % 2 == 0) return *(const unsigned short*)in;
    if (size == 4 && address % 4 == 0) return *(const unsigned int*)in;
    if (size == 8 && address % 8 == 0) return *(const unsigned long long*)in;
    unsigned long long x = 0;
    for (int b = 0; b < size; b++) x |= (unsigned long long)in[b] << (8 * b);
    return x;
}

__device__ void store_value(unsigned char* out, int size, unsigned long long x) {
    unsigned long long address = (unsigned long long)out;
    if (size == 2 && address % 2 == 0) { *(unsigned short*)out = (unsigned short)x; return; }
    if (size == 4 && address % 4 == 0) { *(unsigned int*)out = (unsigned int)x; return; }
    if (size == 8 && address % 8 == 0) { *(unsigned long long*)out = x; return; }
    for (int b = 0; b < size; b++) out[b] = (unsigned char)(x >> (8 * b));
}

__device__ unsigned long long rotate_left(unsigned long long x, int size) {
    int bits = 8 * size;
    unsigned long long mask = bits == 64 ? ~0ULL : ((1ULL << bits) - 1);
    return ((x << 1) | (x >> (bits - 1))) & mask;
}

__device__ unsigned long long rotate_right(unsigned long long x, int size) {
    return (x >> 1) | ((x & 1ULL) << (8 * size - 1));
}

// Where value v lies: its region r, index i in the region, value size, plane stride n, and the
// addresses of the value (data) and of its byte in the first plane.
struct Place { int r; long long i; int size; long long n; long long data; long long plane; };

__device__ Place place_of(const long long* first_value, const long long* offset,
                          const long long* plane_offset, const long long* stride, const long long* item_size,
                          int regions, long long v) {
    Place at;
    at.r = find_region(first_value, regions, v);
    at.i = v - first_value[at.r];
    at.size = (int)item_size[at.r];
    at.n = stride[at.r];
    at.data = offset[at.r] + at.i * at.size;
    at.plane = plane_offset[at.r] + at.i;
    return at;
}

// Whether the GROUP values from v lie in one region, 16-byte aligned in the data (at `base`)
// and in the planes (plane starts are aligned), so that they move as whole 16-byte words.
__device__ bool whole_group(const long long* first_value, int regions, long long values, long long v,
                            Place at, const unsigned char* base) {
    long long end = at.r + 1 < regions ? first_value[at.r + 1] : values;
    return at.size > 1 && v + GROUP <= end && at.i % GROUP == 0
        && ((unsigned long long)(base + at.data)) % 16 == 0;
}

// Value k of a group held in 32-bit words (little-endian).
template <int SIZE> __device__ unsigned long long value_at(const unsigned int* words, int k) {
    if (SIZE == 2) return (words[k / 2] >> (16 * (k & 1))) & 0xFFFF;
    if (SIZE == 4) return words[k];
    return words[2 * k] | ((unsigned long long)words[2 * k + 1] << 32);
}

// A whole group of SIZE-byte values (see whole_group): loaded, rotated and scattered to the
// planes in registers, with 16-byte loads and one 16-byte store per plane.
template <int SIZE> __device__ void split_group(const unsigned char* in, unsigned char* plane, long long n) {
    unsigned int words[GROUP * SIZE / 4];
    for (int w = 0; w < GROUP * SIZE / 16; w++) ((uint4*)words)[w] = ((const uint4*)in)[w];
    unsigned int packed[SIZE][GROUP / 4] = {};
    for (int k = 0; k < GROUP; k++) {
        unsigned long long x = rotate_left(value_at<SIZE>(words, k), SIZE);
        for (int p = 0; p < SIZE; p++)
            packed[p][k / 4] |= (unsigned int)((x >> (8 * (SIZE - 1 - p))) & 0xFF) << (8 * (k % 4));
    }
    for (int p = 0; p < SIZE; p++)
        *(uint4*)(plane + p * n) = make_uint4(packed[p][0], packed[p][1], packed[p][2], packed[p][3]);
}

// Inverse of split_group.
template <int SIZE> __device__ void merge_group(const unsigned char* plane, long long n, unsigned char* out) {
    unsigned int packed[SIZE][GROUP / 4];
    for (int p = 0; p < SIZE; p++) {
        uint4 word = *(const uint4*)(plane + p * n);
        packed[p][0] = word.x; packed[p][1] = word.y; packed[p][2] = word.z; packed[p][3] = word.w;
    }
    unsigned int words[GROUP * SIZE / 4] = {};
    for (int k = 0; k < GROUP; k++) {
        unsigned long long x = 0;
        for (int p = 0; p < SIZE; p++)
            x |= (unsigned long long)((packed[p][k / 4] >> (8 * (k % 4))) & 0xFF) << (8 * (SIZE - 1 - p));
        x = rotate_right(x, SIZE);
        if (SIZE == 2) words[k / 2] |= (unsigned int)x << (16 * (k & 1));
        if (SIZE == 4) words[k] = (unsigned int)x;
        if (SIZE == 8) { words[2 * k] = (unsigned int)x; words[2 * k + 1] = (unsigned int)(x >> 32); }
    }
    for (int w = 0; w < GROUP * SIZE / 16; w++) ((uint4*)out)[w] = ((const uint4*)words)[w];
}

// One thread per GROUP values: rotate each left one bit and scatter its bytes to the planes
// (MSB first); whole groups move in 16-byte words, the others value by value.
extern "C" __global__ void split_planes(const unsigned char* src, unsigned char* dst,
                                        const long long* first_value, const long long* offset,
                                        const long long* plane_offset, const long long* stride,
                                        const long long* item_size, int regions, long long values) {
    long long v0 = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * GROUP;
    if (v0 >= values) return;
    Place at = place_of(first_value, offset, plane_offset, stride, item_size, regions, v0);
    if (whole_group(first_value, regions, values, v0, at, src)) {
        if (at.size == 2) split_group<2>(src + at.data, dst + at.plane, at.n);
        else if (at.size == 4) split_group<4>(src + at.data, dst + at.plane, at.n);
        else split_group<8>(src + at.data, dst + at.plane, at.n);
        return;
    }
    for (long long v = v0; v < v0 + GROUP && v < values; v++) {
        Place one = place_of(first_value, offset, plane_offset, stride, item_size, regions, v);
        if (one.size == 1) { dst[one.plane] = src[one.data]; continue; }
        unsigned long long x = rotate_left(load_value(src + one.data, one.size), one.size);
        for (int p = 0; p < one.size; p++)
            dst[one.plane + p * one.n] = (unsigned char)(x >> (8 * (one.size - 1 - p)));
    }
}

// Inverse of split_planes.
extern "C" __global__ void merge_planes(const unsigned char* src, unsigned char* dst,
                                        const long long* first_value, const long long* offset,
                                        const long long* plane_offset, const long long* stride,
                                        const long long* item_size, int regions, long long values) {
    long long v0 = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * GROUP;
    if (v0 >= values) return;
    Place at = place_of(first_value, offset, plane_offset, stride, item_size, regions, v0);
    if (whole_group(first_value, regions, values, v0, at, dst)) {
        if (at.size == 2) merge_group<2>(src + at.plane, at.n, dst + at.data);
        else if (at.size == 4) merge_group<4>(src + at.plane, at.n, dst + at.data);
        else merge_group<8>(src + at.plane, at.n, dst + at.data);
        return;
    }
    for (long long v = v0; v < v0 + GROUP && v < values; v++) {
        Place one = place_of(first_value, offset, plane_offset, stride, item_size, regions, v);
        if (one.size == 1) { dst[one.data] = src[one.plane]; continue; }
        unsigned long long x = 0;
        for (int p = 0; p < one.size; p++)
            x |= (unsigned long long)src[one.plane + p * one.n] << (8 * (one.size - 1 - p));
        store_value(dst + one.data, one.size, rotate_right(x, one.size));
    }
}

// One block per segment s (table: source addresses, then target addresses, then lengths,
// `segments` each): copy its bytes; 16 bytes at a time where both ends are 16-byte aligned.
// The host cuts segments into pieces of at most COPY_PIECE bytes, so that a long one keeps
// many blocks busy. Addresses, not offsets: one launch copies between any buffers.
extern "C" __global__ void copy_segments(const long long* table, int segments) {
    int s = blockIdx.x;
    const unsigned char* in = (const unsigned char*)table[s];
    unsigned char* out = (unsigned char*)table[segments + s];
    long long n = table[2 * segments + s];
    if ((((unsigned long long)in | (unsigned long long)out) & 15) == 0) {
        long long words = n / 16;
        for (long long k = threadIdx.x; k < words; k += blockDim.x)
            ((uint4*)out)[k] = ((const uint4*)in)[k];
        for (long long k = words * 16 + threadIdx.x; k < n; k += blockDim.x) out[k] = in[k];
        return;
    }
    // Otherwise whole 4-byte words are stored from where `out` is aligned, each made of the two
    // aligned source words it straddles (a byte loop moved a quarter as much per thread).
    long long head = (4 - ((unsigned long long)out & 3)) & 3;
    head = head < n ? head : n;
    for (long long k = threadIdx.x; k < head; k += blockDim.x) out[k] = in[k];
    const unsigned char* from_in = in + head;
    int misaligned = (int)((unsigned long long)from_in & 3);
    const unsigned int* words_in = (const unsigned int*)(from_in - misaligned);
    unsigned int* words_out = (unsigned int*)(out + head);
    long long words = (n - head) / 4;
    for (long long k = threadIdx.x; k < words; k += blockDim.x) {
        unsigned int low = words_in[k];
        words_out[k] = misaligned ? __funnelshift_r(low, words_in[k + 1], 8 * misaligned) : low;
    }
    for (long long k = head + words * 4 + threadIdx.x; k < n; k += blockDim.x) out[k] = in[k];
}
"""


@dataclass
class _Coded:
    """Where the frames of a batch's planes were coded to (frame ``f`` of :class:`Frames`).

    Frame ``f``, where ``coded[f]`` (else its plane is stored raw, being near-random), lies at
    ``offset[f]`` of ``output``, ``length[f]`` bytes long.
    """

    output: cp.ndarray | None
    coded: np.ndarray
    offset: np.ndarray
    length: np.ndarray


@dataclass
class _Job:
    """Frames handed to one coder (``chosen``, of the batch's frames): its output (the ``i``-th
    at ``i * capacity``) and each frame's coded length, in pinned memory once ``done`` has
    happened."""

    chosen: np.ndarray
    output: cp.ndarray
    capacity: int
    lengths: np.ndarray
    done: cp.cuda.Event


@dataclass
class _NvcompDecode:
    """A queued decode by nvCOMP's Zstd; what it reads and writes stays referenced until it is
    checked."""

    decoded: object  # nvCOMP's output batch: its sizes are known once the stream is done
    sizes: list[int]
    buffers: tuple

    def __call__(self) -> bool:
        """Raise :class:`CodecError` unless every frame decoded to its size. False: these frames
        were queued before the merge, which needs no second run for them."""
        if batch_sizes(self.decoded) != self.sizes:
            raise CodecError("zstd frames decoded to the wrong lengths (damaged chunk)")
        return False


@dataclass
class _AnsCheck:
    """Queued ANS decoding: ``bad`` (device) counts the frames that failed once the stream is done."""

    bad: cp.ndarray

    def __call__(self) -> bool:
        """Raise :class:`CodecError` if any frame failed; False: no second merge is needed."""
        if int(self.bad.get()[0]):
            raise CodecError("ans frames do not decode to their sizes (damaged chunk)")
        return False


@dataclass
class _SplitBatch:
    """A batch to encode: laid out on the host, then split into planes and counted on the GPU.

    Where it has frames, ``entropy`` (pinned host memory) holds each plane's entropy once
    ``counted`` has happened.
    """

    data: cp.ndarray
    layout: _Layout
    planes_buffer: cp.ndarray
    planes: np.ndarray  # rows: plane buffer offset, length
    frames: Frames
    bounds: np.ndarray
    counts: Counts | None = None
    entropy: np.ndarray | None = None
    counted: cp.cuda.Event | None = None


@dataclass
class _QueuedDecode:
    """A batch whose decoding is queued: its output, and the checks to run once the stream is done."""

    out: cp.ndarray
    planes_buffer: cp.ndarray
    layout: _Layout
    checks: list[Callable[[], bool]]


@dataclass
class _Layout:
    """A batch's regions, chunk by chunk, as kernel tables and as host columns.

    Planes are listed region by region (the order of the parameter tables), each region's
    planes most significant first.
    """

    tables: tuple  # device rows (int64): first value, data offset, plane offset, stride, value size
    values: int
    plane_bytes: int
    chunks: int
    region_chunk: np.ndarray
    region_kind: np.ndarray
    region_length: np.ndarray
    plane_start: np.ndarray  # where each plane starts in the plane buffer
    plane_length: np.ndarray
    plane_chunk: np.ndarray


class GpuEngine:
    """nvCOMP on one GPU, with the plane transform done by CUDA kernels; thread-safe.

    It trusts what it decodes: the store checks each chunk's CRC first (nvCOMP may fault on a
    damaged frame, which would spoil the CUDA context, instead of reporting it).
    """

    name = "gpu"
    rejects_damaged_input = False

    def __init__(self, level: int = 3, device: int = 0, codec: str = "portable") -> None:
        if codec not in ("portable", "ans"):
            raise CodecError(f"codec {codec!r} is not known (use portable or ans)")
        self.device = device
        self.codec = Codec.ANS if codec == "ans" else Codec.ZSTD_FRAMES
        self._frame_size = ANS_FRAME_SIZE if codec == "ans" else GPU_FRAME_SIZE
        self._cpu = CpuEngine(level)  # decodes chunks without a transform (whole-chunk zstd or raw)
        self._detector = PlaneCoder(level)
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        # Host copies into and out of the pinned buffer run on several threads (numpy releases
        # the GIL): one thread moves only a few GB/s, and page faults on fresh memory slow it more.
        self._copiers = ThreadPoolExecutor(_COPY_THREADS, thread_name_prefix="nvfs-gpu-copy")
        started: Future = Future()
        self._thread = threading.Thread(target=self._dispatch, args=(started,), name="nvfs-gpu", daemon=True)
        self._thread.start()
        started.result()  # raises here if the GPU or nvCOMP cannot be set up

    # -- the Engine interface: called from many threads -----------------------------------

    def encode(self, data: bytes, regions: Sequence[Region] | None = None) -> Encoded:
        if regions is None:
            regions = detect_regions(data, self._detector)
        check_regions(len(data), regions)
        return self._submit("encode", (data, list(regions)))

    def decode(self, encoded: Encoded, raw_length: int, out: memoryview | None = None
               ) -> bytes | bytearray | memoryview:
        if encoded.transform != Transform.PLANES:
            return self._cpu.decode(encoded, raw_length, out)
        return self._submit("decode", (encoded, raw_length))  # into its own buffer, not ``out``

    def close(self) -> None:
        """Stop the dispatcher thread (pending requests are served first); idempotent.

        nvCOMP's objects are freed by that thread before it ends: freed at interpreter exit,
        after CUDA's own teardown, they crash the process.
        """
        if self._thread.is_alive():
            self._requests.put(None)
            self._thread.join()
        self._copiers.shutdown()

    def _submit(self, kind: str, item: tuple) -> object:
        future: Future = Future()
        self._requests.put((kind, item, future))
        return future.result()

    # -- the dispatcher thread --------------------------------------------------------------

    def _dispatch(self, started: Future) -> None:
        try:
            self._setup()
        except Exception as exc:  # any CUDA or nvCOMP failure means: no GPU engine here
            started.set_exception(CodecError(f"the GPU engine cannot start on device {self.device}: {exc}"))
            return
        started.set_result(None)
        atexit.register(self.close)
        try:
            self._serve_batches()
        finally:
            del self._zstd

    def _serve_batches(self) -> None:
        while True:
            first = self._requests.get()
            if first is None:
                return
            batch, stop = [first], False
            size = _request_bytes(first)
            while size < BATCH_BYTES:
                try:
                    request = self._requests.get_nowait()
                except queue.Empty:
                    break
                if request is None:
                    stop = True
                    break
                batch.append(request)
                size += _request_bytes(request)
            for kind, run in (("encode", self.encode_batch), ("decode", self.decode_batch)):
                self._serve([request for request in batch if request[0] == kind], run)
            if stop:
                return

    @staticmethod
    def _serve(requests: list, run) -> None:
        if not requests:
            return
        started = time.perf_counter()
        try:
            results = run([request[1] for request in requests])
        except Exception as exc:
            if len(requests) == 1:
                requests[0][2].set_exception(exc if isinstance(exc, CodecError) else CodecError(str(exc)))
                return
            for request in requests:  # find the culprit: retry one by one
                GpuEngine._serve([request], run)
            return
        log.debug("gpu %s batch: %d chunks, %.1f MiB in %.1f ms", requests[0][0], len(requests),
                  sum(_request_bytes(request) for request in requests) / (1 << 20),
                  (time.perf_counter() - started) * 1e3)
        for request, result in zip(requests, results, strict=True):
            request[2].set_result(result)

    def _setup(self) -> None:
        cp.cuda.Device(self.device).use()
        self._stream = cp.cuda.Stream(non_blocking=True)
        self._done = cp.cuda.Event(block=True, disable_timing=True)  # see _wait
        module = cp.RawModule(code=_KERNELS)
        self._split_kernel = module.get_function("split_planes")
        self._merge = module.get_function("merge_planes")
        self._copy = module.get_function("copy_segments")
        self._tables = TableUploads(self._stream)
        self._huffman = HuffmanFrames(self._tables)
        # Both coders work on our stream, so their work is ordered with our kernels. nvCOMP's
        # Python Codec decodes the CPU engine's zstd frames (the few our kernel leaves: see
        # _decompress); uncomp_chunk_size is the largest frame it handles (its default is
        # 64 KiB). It is freed before the stream (see _dispatch).
        self._zstd = nvcomp.Codec(algorithm="Zstd", uncomp_chunk_size=FRAME_SIZE,
                                  bitstream_kind=nvcomp.BitstreamKind.RAW, device_id=self.device,
                                  cuda_stream=self._stream.ptr)
        self._ans = AnsFrames(self._stream, self._tables, ANS_FRAME_SIZE)
        self._pinned = np.empty(0, dtype=np.uint8)
        warm_up = np.zeros(1 << 20, dtype=np.uint8).tobytes()  # compiles the kernels, sizes the pools
        self.encode_batch([(warm_up, [Region(len(warm_up), ElementKind.BF16)])])

    # -- batches: also the benchmark's entry points; one thread at a time (the dispatcher's) --

    def encode_batch(self, items: Sequence[tuple[bytes, list[Region]]]) -> list[Encoded]:
        """Encode chunks (data, regions covering it) together; returns one :class:`Encoded` each."""
        buffers = [memoryview(data) for data, _ in items]
        with self._stream:
            device = self._upload(buffers, reserve=sum(len(buffer) for buffer in buffers))
            regions = [chunk_regions for _, chunk_regions in items]
            ((params, payload, offsets),) = self.encode_device_batches([(device, regions)])
            host = self._download(payload)
        chunk_codec = Codec.ANS if self.codec == Codec.ANS else Codec.ZSTD
        payloads = self._copy_out(host, offsets)
        return [planes_or_raw(data, chunk_params, payload, chunk_codec)
                for (data, _), chunk_params, payload in zip(items, params, payloads, strict=True)]

    def encode_device(self, data: cp.ndarray, regions: Sequence[Sequence[Region]]) -> DeviceEncoded:
        """Encode chunks lying back to back in device memory (uint8).

        Returns each chunk's transform parameters, the payloads back to back in device memory,
        and the payload offsets (one more than there are chunks).
        """
        return self.encode_device_batches([(data, regions)])[0]

    def encode_device_batches(self, batches: Sequence[tuple[cp.ndarray, Sequence[Sequence[Region]]]]
                              ) -> list[DeviceEncoded]:
        """:meth:`encode_device` of several batches, the host's work on one overlapping the GPU's
        on another: most of a batch's time is host work, and no step queued here waits for the
        GPU (the coders included: see :mod:`nvfs.codec.nvcomp_ans`)."""
        results: list[DeviceEncoded] = []
        if not batches:
            return results
        with self._stream:
            split = [self._prepare(*batch) for batch in batches[:2]]
            job = self._launch_code(split[0])
            for index in range(len(batches)):
                coded = self._collect_code(split[0], job)
                job = self._launch_code(split[1]) if len(split) > 1 else None  # the GPU codes the next
                if index + 2 < len(batches):
                    split.append(self._prepare(*batches[index + 2]))  # and splits the one after, while
                results.append(self._assemble(split.pop(0), coded))  # the host lays it out and assembles
        return results

    def _prepare(self, data: cp.ndarray, regions: Sequence[Sequence[Region]]) -> _SplitBatch:
        """Lay out a batch (its kernel tables, its planes and their frames), and queue its plane
        split and the byte counts of its frames and planes."""
        layout = _layout(regions, self._tables)
        planes = np.stack((layout.plane_start, layout.plane_length), axis=1)
        frames, bounds = plane_frames(planes, self._frame_size)
        planes_buffer = cp.empty(layout.plane_bytes, dtype=cp.uint8)
        batch = _SplitBatch(data, layout, planes_buffer, planes, frames, bounds)
        self._launch(self._split_kernel, batch.data, batch.planes_buffer, batch.layout)
        if len(batch.frames.start):
            batch.counts = self._huffman.count(batch.planes_buffer, batch.frames, batch.bounds)
            batch.entropy, batch.counted = self._fetch(batch.counts.entropy)
        return batch

    def _fetch(self, device: cp.ndarray) -> tuple[np.ndarray, cp.cuda.Event]:
        """Queue a copy of a small device array to pinned host memory: the host array, valid once
        the returned event has happened (waiting on it does not wait for work queued later)."""
        memory = cp.cuda.alloc_pinned_memory(max(device.nbytes, 1))
        host = np.frombuffer(memory, dtype=device.dtype, count=device.size)
        device.get(stream=self._stream, out=host, blocking=False)
        done = cp.cuda.Event(block=True, disable_timing=True)  # block: wait without the GIL
        done.record(self._stream)
        return host, done

    def decode_batch(self, items: Sequence[tuple[Encoded, int]]) -> list[memoryview]:
        """Decode chunks written with transform 1 by any engine; returns their bytes."""
        tables = [parse_params(encoded.params, raw, len(encoded.payload)) for encoded, raw in items]
        with self._stream:
            payload = self._upload([memoryview(encoded.payload) for encoded, _ in items],
                                   reserve=sum(raw for _, raw in items))
            payload_offsets = np.cumsum([0] + [len(encoded.payload) for encoded, _ in items]).tolist()
            (out,) = self._finish_decodes([self._queue_decode(payload, payload_offsets, tables)])
            host = self._download(out)
        return self._copy_out(host, np.cumsum([0] + [raw for _, raw in items]).tolist())

    def decode_device(self, payload: cp.ndarray, payload_offsets: Sequence[int],
                      tables: Sequence[Sequence[RegionEntry]]) -> cp.ndarray:
        """Decode chunks whose payloads lie back to back in device memory; returns their bytes."""
        return self.decode_device_batches([(payload, payload_offsets, tables)])[0]

    def decode_device_batches(self, batches: Sequence[DeviceBatch]) -> list[cp.ndarray]:
        """:meth:`decode_device` of several batches, with one wait for all of them: the host
        lays out each batch while the GPU still decodes the ones before."""
        with self._stream:
            return self._finish_decodes([self._queue_decode(*batch) for batch in batches])

    def _queue_decode(self, payload: cp.ndarray, payload_offsets: Sequence[int],
                      tables: Sequence[Sequence[RegionEntry]]) -> _QueuedDecode:
        """Queue the decoding of a batch: the frames, then the merge of the planes into values.

        The merge is queued before any frame's status is known (see :meth:`_finish_decodes`).
        """
        layout = _table_layout(tables, self._tables)
        total = int(layout.region_length.sum())
        planes_buffer = cp.empty(layout.plane_bytes, dtype=cp.uint8)
        raw_segments: list[tuple[int, int, int]] = []
        framed: dict[Codec, list[FramedPlane]] = {}
        targets = iter(layout.plane_start.tolist())
        for chunk, table in enumerate(tables):
            source = payload_offsets[chunk]
            for entry in table:
                plane_length = entry.plane_length
                for plane in entry.planes:
                    target = next(targets)
                    if plane.codec == Codec.RAW:
                        raw_segments.append((source, target, plane.stored))
                    elif plane.codec == Codec.ZSTD:  # one frame (the CPU engine's byte regions)
                        framed.setdefault(Codec.ZSTD_FRAMES, []).append(
                            (source, target, plane_length, plane_length, (plane.stored,)))
                    else:
                        framed.setdefault(plane.codec, []).append(
                            (source, target, plane_length, plane.frame_size, plane.frame_lengths))
                    source += plane.stored
        self._copy_segments((payload, planes_buffer, raw_segments))
        checks = [self._decompress(codec, payload, planes_buffer, frame_table(planes))
                  for codec, planes in framed.items()]
        out = cp.empty(total, dtype=cp.uint8)
        self._launch(self._merge, planes_buffer, out, layout)
        return _QueuedDecode(out, planes_buffer, layout, checks)

    def _finish_decodes(self, queued: Sequence[_QueuedDecode]) -> list[cp.ndarray]:
        """Wait for the stream (once, if any frames need checking) and check queued batches;
        returns their outputs, complete once the stream is done again: the merge is queued
        again in the rare batch where some frames needed nvCOMP after all."""
        if any(decode.checks for decode in queued):
            self._wait()
        for decode in queued:
            if any([check() for check in decode.checks]):
                self._launch(self._merge, decode.planes_buffer, decode.out, decode.layout)
        return [decode.out for decode in queued]

    # -- steps ------------------------------------------------------------------------------

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

    def _launch(self, kernel, source: cp.ndarray, target: cp.ndarray, layout: _Layout) -> None:
        if layout.values == 0:
            return
        blocks = -(-layout.values // (_THREADS * _GROUP))
        regions = np.int32(len(layout.tables[0]))
        kernel((blocks,), (_THREADS,), (source, target, *layout.tables, regions, np.int64(layout.values)))

    def _launch_code(self, batch: _SplitBatch) -> _Job | None:
        """Queue the coding of the frames of planes worth coding, in one launch, once the planes'
        byte counts are in; None where there is nothing to code.

        Near-random planes are stored raw (the CPU engine's entropy test, on whole planes here,
        from byte counts that the Huffman tables need anyway): coding them only costs time.
        """
        if batch.counts is None:
            return None
        batch.counted.synchronize()
        lengths, frames = batch.planes[:, 1], batch.frames
        skewed = batch.entropy <= RANDOM_BITS
        worth = (np.diff(batch.bounds) > 0) & ((lengths < 4 * RAW_TEST_SAMPLE) | skewed)
        chosen = np.flatnonzero(worth[frames.plane])
        if not len(chosen):
            return None
        if self.codec == Codec.ANS:
            capacity = self._ans.capacity
            output = cp.empty(len(chosen) * capacity, dtype=cp.uint8)
            lengths = self._ans.encode(batch.planes_buffer, frames.start[chosen], frames.size[chosen], output)
        else:
            capacity = FRAME_CAPACITY
            output, lengths = self._huffman.encode(batch.planes_buffer, frames.subset(chosen), chosen,
                                                   batch.counts, np.flatnonzero(worth))
        return _Job(chosen, output, capacity, *self._fetch(lengths))

    def _collect_code(self, batch: _SplitBatch, job: _Job | None) -> _Coded:
        """Wait for a coding job; where each frame of the batch went (see :class:`_Coded`)."""
        count = len(batch.frames.start)
        coded = _Coded(None, np.zeros(count, dtype=bool), np.zeros(count, dtype=np.int64),
                       np.zeros(count, dtype=np.int64))
        if job is None:
            return coded
        coded.output = job.output
        coded.coded[job.chosen] = True
        coded.offset[job.chosen] = np.arange(len(job.chosen)) * job.capacity
        job.done.synchronize()
        coded.length[job.chosen] = job.lengths
        return coded

    def _assemble(self, batch: _SplitBatch, coded: _Coded) -> DeviceEncoded:
        """Lay out each chunk's payload (its planes' stored bytes in table order) in one buffer.

        A plane keeps its coded frames where they are smaller than the plane, else it is stored
        raw. Whole-batch numpy steps: a Python step per plane cost more than the GPU's work.
        """
        layout, planes, bounds, planes_buffer = batch.layout, batch.planes, batch.bounds, batch.planes_buffer
        lengths = planes[:, 1]
        frame_plane = np.repeat(np.arange(len(planes)), np.diff(bounds))
        plane_coded = np.zeros(len(planes), dtype=bool)
        plane_coded[frame_plane[coded.coded]] = True
        coded_bytes = np.bincount(frame_plane, weights=coded.length, minlength=len(planes)).astype(np.int64)
        keep = plane_coded & (coded_bytes < lengths)
        stored = np.where(keep, coded_bytes, lengths)
        plane_start = np.cumsum(stored) - stored
        kept = np.flatnonzero(keep[frame_plane])  # frames of planes that keep them, in plane order
        kept_plane, kept_length = frame_plane[kept], coded.length[kept]
        before = np.cumsum(kept_length) - kept_length
        targets = plane_start[kept_plane] + before - before[np.searchsorted(kept_plane, kept_plane)]
        chunk_bytes = np.bincount(layout.plane_chunk, weights=stored, minlength=layout.chunks)
        chunk_bytes = chunk_bytes.astype(np.int64)
        payload = cp.empty(int(stored.sum()), dtype=cp.uint8)
        raw = np.flatnonzero(~keep & (lengths > 0))
        raw_rows = np.stack((planes[raw, 0], plane_start[raw], lengths[raw]), axis=1)
        coded_rows = np.stack((coded.offset[kept], targets, kept_length), axis=1)
        self._copy_segments((planes_buffer, payload, raw_rows), (coded.output, payload, coded_rows))
        params = pack_batch_params(BatchPlanes(  # while the GPU copies
            layout.chunks, layout.region_kind, layout.region_length, layout.region_chunk,
            np.where(keep, int(self.codec), int(Codec.RAW)), stored, self._frame_size, kept_plane,
            kept_length))
        return params, payload, np.concatenate(([0], np.cumsum(chunk_bytes))).tolist()

    def _decompress(self, codec: Codec, payload: cp.ndarray, planes_buffer: cp.ndarray,
                    frames: np.ndarray) -> Callable[[], bool]:
        """Queue the decoding of frames (payload offset, stored length, plane buffer offset, size).

        Zstd frames of the shape this engine writes (Huffman-coded literals only, RLE or raw)
        are decoded in place by our kernel; nvCOMP decodes the others (the CPU engine's carry
        a few matches) and the ANS frames. Returns the check to call once the stream is done:
        it raises :class:`CodecError` for damaged frames, decodes (and waits for) the frames
        our kernel left to nvCOMP, and says whether there were any.
        """
        if codec != Codec.ZSTD_FRAMES:
            return self._nvcomp_decode(codec, payload, planes_buffer, frames)
        status = self._huffman.decode(payload, frames[:, 0], frames[:, 1], planes_buffer, frames[:, 2],
                                      frames[:, 3])

        def check() -> bool:
            found = status.get()
            if (found == FRAME_DAMAGED).any():
                raise CodecError("zstd frames do not decode to their sizes (damaged chunk)")
            rest = np.flatnonzero(found != FRAME_DECODED)
            if not len(rest):
                return False
            check_rest = self._nvcomp_decode(codec, payload, planes_buffer, frames[rest])
            self._wait()
            check_rest()
            return True

        return check

    def _nvcomp_decode(self, codec: Codec, payload: cp.ndarray, planes_buffer: cp.ndarray,
                       frames: np.ndarray) -> Callable[[], bool]:
        """Queue nvCOMP's decoding of frames, gathered first at aligned offsets as nvCOMP wants
        its inputs; returns the check of their decoding, for once the stream is done."""
        lengths, targets, sizes = frames[:, 1], frames[:, 2], frames[:, 3]
        starts = np.concatenate(([0], np.cumsum(aligned(lengths))))
        gathered = cp.empty(int(starts[-1]), dtype=cp.uint8)
        self._copy_segments((payload, gathered, np.stack((frames[:, 0], starts[:-1], lengths), axis=1)))
        if codec == Codec.ANS:
            return _AnsCheck(self._ans.decode(gathered, starts[:-1], lengths, planes_buffer, targets, sizes))
        sources_batch = nvcomp.as_arrays(gathered, starts[:-1].tolist(), lengths.tolist(), self._stream.ptr)
        targets_batch = nvcomp.as_arrays(planes_buffer, targets.tolist(), sizes.tolist(), self._stream.ptr)
        decoded = self._zstd.decode(sources_batch, out=targets_batch)
        return _NvcompDecode(decoded, sizes.tolist(), (gathered, sources_batch, targets_batch))

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


def _request_bytes(request: tuple) -> int:
    kind, item, _ = request
    return len(item[0]) if kind == "encode" else item[1]


def _layout(regions: Sequence[Sequence[Region]], tables: TableUploads) -> _Layout:
    """Kernel tables for chunks placed back to back, in the order given."""
    return _columns_layout([len(chunk_regions) for chunk_regions in regions],
                           [(int(region.kind), region.length) for chunk_regions in regions
                            for region in chunk_regions], tables)


def _table_layout(chunk_tables: Sequence[Sequence[RegionEntry]], tables: TableUploads) -> _Layout:
    """:func:`_layout` of chunks described by their parameter tables."""
    return _columns_layout([len(table) for table in chunk_tables],
                           [(int(entry.kind), entry.length) for table in chunk_tables for entry in table],
                           tables)


def _columns_layout(per_chunk: Sequence[int], regions: Sequence[tuple[int, int]],
                    tables: TableUploads) -> _Layout:
    """The layout of chunks holding ``per_chunk[c]`` regions each, given as (kind, length) in order.

    Each plane starts at a multiple of ``device_tables.ALIGN`` in the plane buffer, so every frame that
    nvCOMP reads or writes there is aligned as it requires. Whole-batch numpy steps: a Python
    step per region was a tenth of a batch's time.
    """
    kind, length = np.array(regions, dtype=np.int64).reshape(-1, 2).T
    size = item_sizes(kind)
    values = length // size
    stride = aligned(values)
    plane_base = np.cumsum(size * stride) - size * stride
    (table,) = tables.upload(np.stack((np.cumsum(values) - values, np.cumsum(length) - length, plane_base,
                                       stride, size))[:, length > 0])  # one row per column, one copy
    plane_region = np.repeat(np.arange(len(kind)), size)
    index = np.arange(len(plane_region)) - (np.cumsum(size) - size)[plane_region]
    region_chunk = np.repeat(np.arange(len(per_chunk)), per_chunk)
    plane_start = plane_base[plane_region] + index * stride[plane_region]
    return _Layout(tuple(table), int(values.sum()), int((size * stride).sum()), len(per_chunk), region_chunk,
                   kind, length, plane_start, values[plane_region], region_chunk[plane_region])


def batch_sizes(batch) -> list[int]:
    """The byte length of each buffer of an nvCOMP batch, as Python ints."""
    sizes = batch.buffer_sizes
    if hasattr(sizes, "__cuda_array_interface__"):
        return cp.asarray(sizes).get().tolist()
    return [int(size) for size in sizes]
