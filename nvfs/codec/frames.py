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
