"""Frames of byte planes, as the GPU engine lays them out for a batch: numpy only.

A plane of a chunk is cut into frames of ``frame_size`` decoded bytes (the last one shorter),
each coded on its own. These helpers make the frame tables the GPU engine codes and decodes
from; they need no GPU, so the CPU tests check them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nvfs.codec.base import item_sizes
from nvfs.codec.planes import FRAMED

# A framed plane to decode: payload offset, plane buffer offset, plane length, frame size, frame lengths.
FramedPlane = tuple[int, int, int, int, tuple[int, ...]]


@dataclass
class Frames:
    """Frames of a plane buffer: start and size of each, and the plane each belongs to."""

    start: np.ndarray  # int64
    size: np.ndarray  # int64
    plane: np.ndarray  # int64, ascending

    def subset(self, chosen: np.ndarray) -> Frames:
        return Frames(self.start[chosen], self.size[chosen], self.plane[chosen])


def plane_frames(planes: np.ndarray, frame_size: int) -> tuple[Frames, np.ndarray]:
    """The frames of planes (rows: offset and length in the plane buffer), and the bounds of
    each plane's frames among them (``bounds[p]:bounds[p + 1]``)."""
    offsets, lengths = planes[:, 0], planes[:, 1]
    counts = -(-lengths // frame_size)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    plane = np.repeat(np.arange(len(planes)), counts)
    index = np.arange(bounds[-1]) - bounds[plane]
    sizes = np.minimum(frame_size, lengths[plane] - index * frame_size)
    return Frames(offsets[plane] + index * frame_size, sizes, plane), bounds


def frame_table(planes: Sequence[FramedPlane]) -> np.ndarray:
    """Rows (payload offset, stored length, plane buffer offset, decoded size), one per frame of
    framed planes given as (payload offset, plane buffer offset, plane length, frame size,
    frame lengths): Python work per plane, numpy per frame."""
    counts = np.array([len(plane[4]) for plane in planes], dtype=np.int64)
    lengths = np.fromiter(itertools.chain.from_iterable(plane[4] for plane in planes), dtype=np.int64,
                          count=int(counts.sum()))
    columns = np.array([plane[:4] for plane in planes], dtype=np.int64).reshape(-1, 4)
    owner = np.repeat(np.arange(len(planes)), counts)
    first = np.cumsum(counts) - counts
    index = np.arange(len(lengths)) - first[owner]
    before = np.cumsum(lengths) - lengths  # stored bytes of the frames before, in all planes
    sources = columns[owner, 0] + before - before[first][owner]
    frame_size = columns[owner, 3]
    sizes = np.minimum(frame_size, columns[owner, 2] - index * frame_size)
    return np.stack((sources, lengths, columns[owner, 1] + index * frame_size, sizes), axis=1)


@dataclass
class BatchPlanes:
    """How the planes of a batch of chunks are stored, in table order (chunk, region, plane).

    Regions: element kind, length and chunk of each. Planes: codec and stored bytes of each.
    Frames (of framed planes only, in plane order): the plane and stored length of each.
    """

    chunks: int
    region_kind: np.ndarray
    region_length: np.ndarray
    region_chunk: np.ndarray
    plane_codec: np.ndarray
    plane_stored: np.ndarray
    frame_size: int
    frame_plane: np.ndarray
    frame_length: np.ndarray


_SLOT = 1 << 32  # field order key: plane index * _SLOT + slot within the plane's fields


def pack_batch_params(batch: BatchPlanes) -> list[bytes]:
    """Each chunk's transform parameters, as :func:`nvfs.codec.planes.pack_params` writes them.

    The GPU engine codes a few hundred planes and thousands of frames per batch; packing them
    chunk by chunk in Python cost more than the GPU's work. Here every field (a region count,
    kind, length, plane codec, stored size, frame size or frame length) is a row of a table
    keyed by its place in the stream, and the bytes of all fields are cut out in one pass.
    """
    plane_counts = item_sizes(batch.region_kind)
    region_first = np.cumsum(plane_counts) - plane_counts
    chunk_regions = np.bincount(batch.region_chunk, minlength=batch.chunks)
    chunk_first_region = np.cumsum(chunk_regions) - chunk_regions
    planes_before = np.concatenate((region_first, [int(plane_counts.sum())]))
    chunk_first_plane = planes_before[chunk_first_region]
    plane_index = np.arange(len(batch.plane_codec))
    framed = np.isin(batch.plane_codec, [int(codec) for codec in FRAMED])
    framed_planes = np.flatnonzero(framed)
    first_frame = np.searchsorted(batch.frame_plane, batch.frame_plane)
    frame_slot = 6 + np.arange(len(batch.frame_plane)) - first_frame
    fields = (  # (key, width, value) columns, one group per kind of field
        (chunk_first_plane * _SLOT, 4, chunk_regions),
        (region_first * _SLOT + 1, 1, batch.region_kind),
        (region_first * _SLOT + 2, 8, batch.region_length),
        (plane_index * _SLOT + 3, 1, batch.plane_codec),
        (plane_index * _SLOT + 4, 8, batch.plane_stored),
        (framed_planes * _SLOT + 5, 4, np.full(len(framed_planes), batch.frame_size)),
        (batch.frame_plane * _SLOT + frame_slot, 4, batch.frame_length),
    )
    keys = np.concatenate([np.asarray(key, dtype=np.int64) for key, _, _ in fields])
    widths = np.concatenate([np.full(len(key), width, dtype=np.int64) for key, width, _ in fields])
    values = np.concatenate([np.asarray(value, dtype=np.uint64) for _, _, value in fields])
    order = np.argsort(keys, kind="stable")
    widths, values = widths[order], values[order]
    starts = np.cumsum(widths) - widths
    field = np.repeat(np.arange(len(widths)), widths)
    shift = (np.arange(int(widths.sum())) - starts[field]).astype(np.uint64) * np.uint64(8)
    stream = ((values[field] >> shift) & np.uint64(0xFF)).astype(np.uint8).tobytes()
    chunk_starts = starts[np.flatnonzero(order < batch.chunks)].tolist() + [len(stream)]
    return [stream[chunk_starts[index] : chunk_starts[index + 1]] for index in range(batch.chunks)]
