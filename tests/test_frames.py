"""Frame tables of byte planes (the GPU engine's bookkeeping), checked against plain loops."""

import numpy as np

from nvfs.codec.frames import frame_table, plane_frames


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
