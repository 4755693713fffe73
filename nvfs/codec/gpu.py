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

Here: the engine, its dispatcher thread and the device set-up. The encode side is
:mod:`nvfs.codec.gpu_encode`, the decode side :mod:`nvfs.codec.gpu_decode`, the steps both
share (transfers, kernel launches, segment copies) :mod:`nvfs.codec.gpu_steps`, the batch
tables :mod:`nvfs.codec.gpu_layout`, and the kernels ``plane_kernels.cu`` and
``zstd_huffman.cu`` (:mod:`nvfs.codec.gpu_huffman`).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from nvfs.codec.base import Codec, CodecError, ElementKind, Encoded, Region, Transform
from nvfs.codec.cpu import CpuEngine
from nvfs.codec.device_tables import TableUploads
from nvfs.codec.gpu_decode import BatchDecoder
from nvfs.codec.gpu_encode import BatchEncoder
from nvfs.codec.gpu_huffman import GPU_FRAME_SIZE, HuffmanFrames
from nvfs.codec.gpu_steps import plane_kernel_source
from nvfs.codec.nvcomp_ans import AnsFrames
from nvfs.codec.planes import FRAME_SIZE, PlaneCoder, check_regions, detect_regions

log = logging.getLogger(__name__)

try:  # the engine is optional: importing nvfs never needs CUDA (make_engine reports why it is absent)
    import cupy as cp
    from nvidia import nvcomp
except ImportError as exc:  # pragma: no cover - depends on the machine
    raise ImportError(f"the GPU engine needs cupy and nvidia-nvcomp (pip install nvfs[cu13]): {exc}") from exc

# Uncompressed bytes coded per GPU batch at most. A batch costs the host about a millisecond
# of bookkeeping whatever its size, so batches of device data are large, enough to keep the
# GPU busy for many times that. The mount's batches are what its workers have in flight, far
# smaller; the pinned staging buffer grows only to the largest host batch seen.
BATCH_BYTES = 512 << 20
# ANS frames carry a table each, and nvCOMP's batched call costs host time per frame: larger
# frames cost fewer tables and less host time, up to where a batch has too few frames to fill
# the GPU (at 1 MiB). Readers take any frame size: it is in each plane's table.
ANS_FRAME_SIZE = 512 << 10
_COPY_THREADS = min(8, os.cpu_count() or 1)


class GpuEngine(BatchEncoder, BatchDecoder):
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
        module = cp.RawModule(code=plane_kernel_source())
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


def _request_bytes(request: tuple) -> int:
    kind, item, _ = request
    return len(item[0]) if kind == "encode" else item[1]
