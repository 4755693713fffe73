"""Frame tables of byte planes (the GPU engine's bookkeeping), checked against plain loops."""

import numpy as np
import pytest

from nvfs.codec.base import ITEM_SIZE, Codec, ElementKind
from nvfs.codec.frames import BatchPlanes, frame_table, pack_batch_params, plane_frames
from nvfs.codec.planes import PlaneEntry, RegionEntry, pack_params

pytestmark = pytest.mark.unit


def test_planes_cut_into_frames_with_a_short_last_one_and_empty_planes_skipped():
    planes = np.array([(0, 10), (256, 0), (512, 25), (1024, 8)], dtype=np.int64)
    frames, bounds = plane_frames(planes, 8)
    expected = []
    for index, (offset, length) in enumerate(planes.tolist()):
        expected += [(offset + start, min(8, length - start), index) for start in range(0, length, 8)]
    got = zip(frames.start.tolist(), frames.size.tolist(), frames.plane.tolist(), strict=True)
    assert list(got) == expected
    assert bounds.tolist() == [0, 2, 2, 6, 7]
    chosen = frames.subset(np.array([1, 5]))
    assert chosen.start.tolist() == [8, 536] and chosen.plane.tolist() == [0, 2]


def test_frame_table_places_each_frame_of_each_plane():
    planes = [(100, 5000, 300_000, 131_072, (10, 20, 30)), (1000, 0, 77, 77, (50,)),
              (5, 9, 65_536 * 2 + 1, 65_536, (7, 8, 9))]
    expected = []
    for source, target, plane_length, frame_size, lengths in planes:
        for index, stored in enumerate(lengths):
            size = min(frame_size, plane_length - index * frame_size)
            expected.append((source, stored, target + index * frame_size, size))
            source += stored
    assert frame_table(planes).tolist() == [list(row) for row in expected]


def test_batch_params_are_the_bytes_pack_params_writes():
    rng = np.random.default_rng(7)
    kinds = [ElementKind.BF16, ElementKind.FP32, ElementKind.BYTES, ElementKind.FP64, ElementKind.FP16]
    chunks, expected = [], []
    for chunk in range(6):
        regions = []
        for _ in range(0 if chunk == 3 else int(rng.integers(1, 4))):  # chunk 3: no regions at all
            kind = kinds[int(rng.integers(len(kinds)))]
            length = ITEM_SIZE[kind] * int(rng.integers(0, 5000))
            planes = []
            for _ in range(ITEM_SIZE[kind]):
                plane_length = length // ITEM_SIZE[kind]
                if plane_length and rng.random() < 0.6:
                    lengths = tuple(int(x) for x in rng.integers(1, 2**31, -(-plane_length // 1000)))
                    planes.append(PlaneEntry(Codec.ZSTD_FRAMES, sum(lengths), 1000, lengths))
                else:
                    planes.append(PlaneEntry(Codec.RAW, plane_length))
            regions.append(RegionEntry(kind, length, tuple(planes)))
        chunks.append(regions)
        expected.append(pack_params(regions))
    regions = [(chunk, region) for chunk, entries in enumerate(chunks) for region in entries]
    planes = [plane for _, region in regions for plane in region.planes]
    frames = [(index, length) for index, plane in enumerate(planes) for length in plane.frame_lengths]
    batch = BatchPlanes(
        len(chunks), np.array([int(region.kind) for _, region in regions]),
        np.array([region.length for _, region in regions]), np.array([chunk for chunk, _ in regions]),
        np.array([int(plane.codec) for plane in planes]), np.array([plane.stored for plane in planes]), 1000,
        np.array([plane for plane, _ in frames], dtype=np.int64), np.array([length for _, length in frames]))
    assert pack_batch_params(batch) == expected
