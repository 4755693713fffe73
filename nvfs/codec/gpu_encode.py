"""The GPU engine's encode side: batches of chunks split into planes, coded, assembled.

Each batch is laid out on the host, split into planes and counted on the GPU, its frames
coded by one launch of the chosen coder (Huffman-only zstd frames, or nvCOMP's ANS), and
its payloads assembled in device memory with the plane table for each chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import cupy as cp
import numpy as np

from nvfs.codec.base import Codec, Encoded, Region
from nvfs.codec.frames import BatchPlanes, Frames, pack_batch_params, plane_frames
from nvfs.codec.gpu_huffman import FRAME_CAPACITY, Counts, HuffmanFrames
from nvfs.codec.gpu_layout import BatchLayout, batch_layout
from nvfs.codec.gpu_steps import DeviceSteps
from nvfs.codec.nvcomp_ans import AnsFrames
from nvfs.codec.planes import RANDOM_BITS, RAW_TEST_SAMPLE, planes_or_raw

# Chunks encoded in device memory: their transform parameters, payloads back to back, payload offsets.
DeviceEncoded = tuple[list[bytes], cp.ndarray, list[int]]


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
class _SplitBatch:
    """A batch to encode: laid out on the host, then split into planes and counted on the GPU.

    Where it has frames, ``entropy`` (pinned host memory) holds each plane's entropy once
    ``counted`` has happened.
    """

    data: cp.ndarray
    layout: BatchLayout
    planes_buffer: cp.ndarray
    planes: np.ndarray  # rows: plane buffer offset, length
    frames: Frames
    bounds: np.ndarray
    counts: Counts | None = None
    entropy: np.ndarray | None = None
    counted: cp.cuda.Event | None = None


class BatchEncoder(DeviceSteps):
    """Encodes batches of chunks; a base of :class:`nvfs.codec.gpu.GpuEngine`.

    Also the benchmark's entry points; one thread at a time (the dispatcher's).
    """

    codec: Codec
    _frame_size: int
    _split_kernel: cp.RawKernel
    _huffman: HuffmanFrames
    _ans: AnsFrames

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

    def encode_device_batches(self, batches: Sequence[tuple[cp.ndarray, Sequence[Sequence[Region]]]]
                              ) -> list[DeviceEncoded]:
        """Encode batches of chunks lying back to back in device memory (uint8), each with its
        chunks' regions; returns, per batch, each chunk's transform parameters, the payloads back
        to back in device memory, and the payload offsets (one more than there are chunks).

        The host's work on one batch overlaps the GPU's on another: most of a batch's time is
        host work, and no step queued here waits for the GPU (the coders included: see
        :mod:`nvfs.codec.nvcomp_ans`)."""
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
        layout = batch_layout(regions, self._tables)
        planes = np.stack((layout.plane_start, layout.plane_length), axis=1)
        frames, bounds = plane_frames(planes, self._frame_size)
        planes_buffer = cp.empty(layout.plane_bytes, dtype=cp.uint8)
        batch = _SplitBatch(data, layout, planes_buffer, planes, frames, bounds)
        self._launch(self._split_kernel, batch.data, batch.planes_buffer, batch.layout)
        if len(batch.frames.start):
            batch.counts = self._huffman.count(batch.planes_buffer, batch.frames, batch.bounds)
            batch.entropy, batch.counted = self._fetch(batch.counts.entropy)
        return batch

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
