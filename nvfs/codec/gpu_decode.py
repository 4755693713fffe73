"""The GPU engine's decode side: payloads to planes, planes merged into values.

Raw planes are copied into place, zstd frames of the shape the GPU engine writes are decoded
by the kernel of ``zstd_huffman.cu``, the others (the CPU engine's, which carry a few matches)
by nvCOMP's Zstd, ANS frames by nvCOMP's ANS; then one kernel merges the planes back into values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import cupy as cp
import numpy as np
from nvidia import nvcomp

from nvfs.codec.base import Codec, CodecError, Encoded
from nvfs.codec.device_tables import aligned
from nvfs.codec.frames import FramedPlane, frame_table
from nvfs.codec.gpu_huffman import FRAME_DAMAGED, FRAME_DECODED, HuffmanFrames
from nvfs.codec.gpu_layout import BatchLayout, table_layout
from nvfs.codec.gpu_steps import DeviceSteps
from nvfs.codec.nvcomp_ans import AnsFrames
from nvfs.codec.planes import RegionEntry, parse_params

# Chunks to decode in device memory: payloads back to back, payload offsets, parameter tables.
DeviceBatch = tuple[cp.ndarray, Sequence[int], Sequence[Sequence[RegionEntry]]]


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
class _QueuedDecode:
    """A batch whose decoding is queued: its output, and the checks to run once the stream is done."""

    out: cp.ndarray
    planes_buffer: cp.ndarray
    layout: BatchLayout
    checks: list[Callable[[], bool]]


class BatchDecoder(DeviceSteps):
    """Decodes batches of chunks; a base of :class:`nvfs.codec.gpu.GpuEngine`.

    Also the benchmark's entry points; one thread at a time (the dispatcher's).
    """

    _merge: cp.RawKernel
    _zstd: nvcomp.Codec
    _huffman: HuffmanFrames
    _ans: AnsFrames

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

    def decode_device_batches(self, batches: Sequence[DeviceBatch]) -> list[cp.ndarray]:
        """Decode batches of chunks whose payloads lie back to back in device memory (payloads,
        payload offsets, parameter tables); returns each batch's bytes in device memory.

        One wait for all of them: the host lays out each batch while the GPU still decodes the
        ones before."""
        with self._stream:
            return self._finish_decodes([self._queue_decode(*batch) for batch in batches])

    def _queue_decode(self, payload: cp.ndarray, payload_offsets: Sequence[int],
                      tables: Sequence[Sequence[RegionEntry]]) -> _QueuedDecode:
        """Queue the decoding of a batch: the frames, then the merge of the planes into values.

        The merge is queued before any frame's status is known (see :meth:`_finish_decodes`).
        """
        layout = table_layout(tables, self._tables)
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


def batch_sizes(batch) -> list[int]:
    """The byte length of each buffer of an nvCOMP batch, as Python ints."""
    sizes = batch.buffer_sizes
    if hasattr(sizes, "__cuda_array_interface__"):
        return cp.asarray(sizes).get().tolist()
    return [int(size) for size in sizes]
