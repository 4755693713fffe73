"""Where each region's values and planes lie in a GPU batch: the plane kernels' tables.

A batch is chunks placed back to back; the kernels find each value's region in device tables
(first value, data offset, plane offset, stride, value size), and the host keeps the same
columns to cut planes into frames and to lay out payloads. Numpy only, but for the upload.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nvfs.codec.base import Region, item_sizes
from nvfs.codec.device_tables import TableUploads, aligned
from nvfs.codec.planes import RegionEntry


@dataclass
class BatchLayout:
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


def batch_layout(regions: Sequence[Sequence[Region]], tables: TableUploads) -> BatchLayout:
    """Kernel tables for chunks placed back to back, in the order given."""
    return _columns_layout([len(chunk_regions) for chunk_regions in regions],
                           [(int(region.kind), region.length) for chunk_regions in regions
                            for region in chunk_regions], tables)


def table_layout(chunk_tables: Sequence[Sequence[RegionEntry]], tables: TableUploads) -> BatchLayout:
    """:func:`batch_layout` of chunks described by their parameter tables."""
    return _columns_layout([len(table) for table in chunk_tables],
                           [(int(entry.kind), entry.length) for table in chunk_tables for entry in table],
                           tables)


def _columns_layout(per_chunk: Sequence[int], regions: Sequence[tuple[int, int]],
                    tables: TableUploads) -> BatchLayout:
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
    return BatchLayout(tuple(table), int(values.sum()), int((size * stride).sum()), len(per_chunk),
                       region_chunk, kind, length, plane_start, values[plane_region],
                       region_chunk[plane_region])
