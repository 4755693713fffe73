"""The byte-plane transform: floats split so that their exponents can be entropy coded.

In a float, the sign and mantissa bits are close to random while the exponent is highly
skewed. Rotating each value left by one bit moves the sign to the bottom, so the top byte
of a bf16 or fp32 value is exactly its exponent. Splitting values into byte planes (all
top bytes, then all next bytes, ...) lets zstd's Huffman stage code the exponent plane
near its order-0 entropy, while the mantissa planes, which do not compress, are stored
raw after a cheap sample test. Zeros make every plane compressible and cost almost nothing.

A chunk is a sequence of :class:`Region` s (from the file's layout, or one detected
region); each region's planes are coded independently (docs/FORMAT.md, "Transform 1").
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import zstandard

from nvfs.codec.base import ITEM_SIZE, Codec, CodecError, ElementKind, Encoded, Region, Transform

try:  # the same loops in C, one pass each (setup.py builds it where there is a compiler)
    from nvfs.codec import _planes as native
except ImportError:  # numpy does the same, slower: several passes per plane instead of one
    native = None
try:  # Huffman-only zstd frames (setup.py builds it where there is a C++ compiler)
    from nvfs.codec import _huffman as huffman
except ImportError:  # zstandard codes every plane, slower: it searches for matches as well
    huffman = None

_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
FRAME_SIZE = 128 << 10  # decoded bytes per frame of a framed plane: one zstd block, GPU-sized work
FRAMED = (Codec.ZSTD_FRAMES, Codec.ANS)
_COUNT = struct.Struct("<I")
_REGION = struct.Struct("<BQ")
_PLANE = struct.Struct("<BQ")
_FRAME = struct.Struct("<I")
RAW_TEST_SAMPLE = 4 << 10  # bytes per sample when deciding whether a plane is worth compressing
RANDOM_BITS = 7.9  # a plane whose samples carry more order-0 entropy per byte is stored raw
# Huffman codes a byte in a bit at least: a plane it shrinks below a quarter is mostly one value,
# whose runs zstd's matches may code far smaller, so zstd is tried on it too.
HUFFMAN_TRY_ZSTD_BELOW = 0.25
_DETECT_SAMPLE = 32 << 10  # bytes per sample when guessing what a chunk holds
_DETECT_KINDS = (ElementKind.BF16, ElementKind.FP32)


@dataclass(frozen=True)
class PlaneEntry:
    """How one plane is stored: its coder, stored bytes and, for framed coders, each frame's length."""

    codec: Codec
    stored: int
    frame_size: int = 0
    frame_lengths: tuple[int, ...] = ()


@dataclass(frozen=True)
class RegionEntry:
    """One region of the parameter table: what it holds and how each of its planes is stored."""

    kind: ElementKind
    length: int
    planes: tuple[PlaneEntry, ...]

    @property
    def plane_length(self) -> int:
        return self.length // ITEM_SIZE[self.kind]


def frame_count(plane_length: int, frame_size: int) -> int:
    """How many frames a framed plane of ``plane_length`` bytes has (the last one may be short)."""
    return -(-plane_length // frame_size)


def pack_params(regions: Sequence[RegionEntry]) -> bytes:
    """The transform parameters for ``regions`` (docs/FORMAT.md, "Transform 1")."""
    parts = [_COUNT.pack(len(regions))]
    for region in regions:
        parts.append(_REGION.pack(region.kind, region.length))
        for plane in region.planes:
            parts.append(_PLANE.pack(plane.codec, plane.stored))
            if plane.codec in FRAMED:
                parts.append(_FRAME.pack(plane.frame_size))
                parts.append(struct.pack(f"<{len(plane.frame_lengths)}I", *plane.frame_lengths))
    return b"".join(parts)


def parse_params(params: bytes, raw_length: int, payload_length: int) -> list[RegionEntry]:
    """Read and check a parameter table; raises :class:`CodecError` on any inconsistency."""
    regions: list[RegionEntry] = []
    try:
        (count,) = _COUNT.unpack_from(params, 0)
        cursor, covered, stored_total = _COUNT.size, 0, 0
        for _ in range(count):
            kind_value, length = _REGION.unpack_from(params, cursor)
            cursor += _REGION.size
            kind = ElementKind(kind_value)
            if length % ITEM_SIZE[kind] or covered + length > raw_length:
                raise CodecError("region table does not fit the chunk")
            planes = []
            for _ in range(ITEM_SIZE[kind]):
                plane, cursor = _parse_plane(params, cursor, length // ITEM_SIZE[kind])
                planes.append(plane)
                stored_total += plane.stored
            regions.append(RegionEntry(kind, length, tuple(planes)))
            covered += length
    except (struct.error, ValueError) as exc:
        raise CodecError(f"transform parameters are damaged: {exc}") from exc
    if covered != raw_length or stored_total != payload_length or cursor != len(params):
        raise CodecError("regions do not add up to the chunk")
    return regions


def _parse_plane(params: bytes, cursor: int, plane_length: int) -> tuple[PlaneEntry, int]:
    codec_value, stored = _PLANE.unpack_from(params, cursor)
    cursor += _PLANE.size
    codec = Codec(codec_value)
    if codec == Codec.RAW and stored != plane_length:
        raise CodecError(f"raw plane holds {stored} bytes, expected {plane_length}")
    if codec not in FRAMED:
        return PlaneEntry(codec, stored), cursor
    (frame_size,) = _FRAME.unpack_from(params, cursor)
    cursor += _FRAME.size
    if frame_size == 0:
        raise CodecError("framed plane with frame size 0")
    frames = frame_count(plane_length, frame_size)
    lengths = struct.unpack_from(f"<{frames}I", params, cursor)
    cursor += 4 * frames
    if sum(lengths) != stored:
        raise CodecError("frame lengths do not add up to the plane")
    return PlaneEntry(codec, stored, frame_size, lengths), cursor


def to_planes(data: memoryview, kind: ElementKind) -> list[np.ndarray]:
    """Split whole values into byte planes, most significant (exponent) plane first.

    Plane ``p`` is byte ``size - 1 - p`` of the value rotated left by one bit (see
    :func:`cut_planes`).
    """
    size = ITEM_SIZE[kind]
    raw = np.frombuffer(data, dtype=np.uint8)
    if size == 1:
        return [raw]
    values = raw.view(_UINT[size])
    planes = np.empty(len(raw), dtype=np.uint8)
    cut_planes(values, 0, size - 1, planes)
    return [planes[index * len(values) : (index + 1) * len(values)] for index in range(size)]


def cut_planes(values: np.ndarray, first: int, last: int, out: np.ndarray) -> None:
    """Write planes ``first`` to ``last`` of ``values`` (unsigned integers of 2 to 8 bytes) into ``out``.

    The planes go back to back, ``len(values)`` bytes each. In C where the extension is
    built (planes from ``first`` to the last one in a single pass over the values), else in
    numpy, a plane at a time: byte ``k >= 1`` of the rotated value is bits ``8k - 1`` to
    ``8k + 6`` of the value itself: one shift, whose result numpy narrows to bytes as it
    stores it (``out=`` a byte array), cuts such a plane out of the values, with no rotated
    copy made first. Byte 0 is the value's low seven bits and then its sign: two such shifts
    and an or. Few numpy calls matter too: in the daemon each one gives up and takes back the
    GIL, which costs more than the pass when the FUSE thread is busy.
    """
    size = values.itemsize
    if native is not None:
        native.cut_planes(values, size, first, last, out)
        return
    count = len(values)
    for index in range(first, last + 1):
        plane = out[(index - first) * count : (index - first + 1) * count]
        if index < size - 1:
            np.right_shift(values, 8 * (size - 1 - index) - 1, out=plane, casting="unsafe")
            continue
        sign = np.empty(count, dtype=np.uint8)
        np.left_shift(values, 1, out=plane, casting="unsafe")
        np.right_shift(values, 8 * size - 1, out=sign, casting="unsafe")
        plane |= sign


def from_planes(planes: Sequence[bytes | memoryview | np.ndarray], kind: ElementKind,
                out: memoryview) -> None:
    """Inverse of :func:`to_planes`, writing the values into ``out``.

    In C where the extension is built (each value assembled and rotated once), else in
    numpy: each plane goes into its byte of the rotated values (one strided pass per plane), then
    the values are rotated back in place in three passes, where widening every plane to a
    value, shifting it and or-ing it in would take three passes per plane.
    """
    size = ITEM_SIZE[kind]
    if size > 1 and native is not None:
        native.merge_planes(planes, size, out)
        return
    target = np.frombuffer(out, dtype=np.uint8)
    if size == 1:
        target[:] = np.frombuffer(planes[0], dtype=np.uint8)
        return
    rotated_bytes = target.reshape(-1, size)
    for index, plane in enumerate(planes):
        rotated_bytes[:, size - 1 - index] = np.frombuffer(plane, dtype=np.uint8)
    values = target.view(_UINT[size])
    sign = np.left_shift(values, 8 * size - 1)  # the lowest bit of a rotated value is its sign
    values >>= 1
    values |= sign


class PlaneCoder:
    """Codes planes with zstd on the CPU or stores them raw; thread-safe (one compressor per thread)."""

    def __init__(self, level: int) -> None:
        self.level = level
        # Exponent planes are literals, not repeats: a tiny match table leaves them to the
        # Huffman stage, which is both faster and closer to the entropy than level 3.
        self._plane_params = zstandard.ZstdCompressionParameters(
            strategy=zstandard.STRATEGY_FAST, min_match=7, hash_log=6, window_log=21, search_log=1,
            chain_log=6, target_length=0)
        self._local = threading.local()

    def _compressors(self) -> tuple[zstandard.ZstdCompressor, zstandard.ZstdCompressor]:
        pair = getattr(self._local, "compressors", None)
        if pair is None:
            pair = self._local.compressors = (
                zstandard.ZstdCompressor(compression_params=self._plane_params),
                zstandard.ZstdCompressor(level=self.level),
            )
        return pair

    def _decompressor(self) -> zstandard.ZstdDecompressor:
        decompressor = getattr(self._local, "decompressor", None)
        if decompressor is None:
            decompressor = self._local.decompressor = zstandard.ZstdDecompressor()
        return decompressor

    def compress_bytes(self, data: memoryview) -> tuple[Codec, bytes]:
        """One zstd frame at the mount's level (metadata, ints, unknown bytes), or raw."""
        if len(data) >= 4 * RAW_TEST_SAMPLE and looks_random(np.frombuffer(data, dtype=np.uint8)):
            return Codec.RAW, data.tobytes()
        packed = self._compressors()[1].compress(data)
        return (Codec.RAW, data.tobytes()) if len(packed) >= len(data) else (Codec.ZSTD, packed)

    def compress_float_plane(self, plane: np.ndarray) -> tuple[PlaneEntry, bytes | memoryview]:
        """Frames of :data:`FRAME_SIZE` bytes, or raw.

        Huffman-only frames where the extension is built (zstd's too, where they may be
        smaller: the smaller is kept), else zstd's with the float-plane parameters. A raw
        plane comes back as a view of ``plane``, which the caller cut into its payload buffer:
        it is where it belongs already.
        """
        view = memoryview(plane).cast("B")
        if len(view) >= 4 * RAW_TEST_SAMPLE and looks_random(plane):
            return PlaneEntry(Codec.RAW, len(view)), view
        coded = _huffman_frames(view) if huffman is not None else None
        if coded is None or coded[0].stored < HUFFMAN_TRY_ZSTD_BELOW * len(view):
            matched = self._zstd_frames(view)
            if coded is None or matched[0].stored < coded[0].stored:
                coded = matched
        if coded[0].stored >= len(view):
            return PlaneEntry(Codec.RAW, len(view)), view
        return coded

    def _zstd_frames(self, view: memoryview) -> tuple[PlaneEntry, bytes]:
        # One call for all frames: it gives up the GIL once, not once per frame. In the daemon
        # every time a worker takes the GIL back it may wait for the FUSE thread's time slice.
        coded = self._compressors()[0].multi_compress_to_buffer(
            [view[start : start + FRAME_SIZE] for start in range(0, len(view), FRAME_SIZE)], threads=0)
        frames = [coded[index] for index in range(len(coded))]
        lengths = tuple(len(frame) for frame in frames)
        return PlaneEntry(Codec.ZSTD_FRAMES, sum(lengths), FRAME_SIZE, lengths), b"".join(frames)

    def decompress(self, plane: PlaneEntry, payload: memoryview, length: int) -> bytes | memoryview:
        """The ``length`` bytes of one plane (or of a whole chunk without a transform)."""
        if plane.codec == Codec.RAW:
            if len(payload) != length:
                raise CodecError(f"raw plane holds {len(payload)} bytes, expected {length}")
            return payload
        if plane.codec == Codec.ZSTD:
            return self._unzstd(payload, length)
        if plane.codec == Codec.ZSTD_FRAMES:
            frames = self._unzstd_frames(plane, payload, length)
            return frames[0] if len(frames) == 1 else b"".join(frames)
        if plane.codec == Codec.ANS:
            raise CodecError("plane is coded with nvCOMP ANS, which only the GPU engine decodes "
                             "(mount with -o engine=gpu on a machine with an NVIDIA GPU and nvCOMP)")
        raise CodecError(f"unknown plane codec {plane.codec}")

    def _unzstd_frames(self, plane: PlaneEntry, payload: memoryview, length: int) -> list[memoryview]:
        """The frames of a framed plane, decoded in one call (one GIL release, as when coding)."""
        frames, sizes, start = [], [], 0
        for index, stored in enumerate(plane.frame_lengths):
            frames.append(payload[start : start + stored])
            sizes.append(min(plane.frame_size, length - index * plane.frame_size))
            start += stored
        try:
            decoded = self._decompressor().multi_decompress_to_buffer(
                frames, decompressed_sizes=struct.pack(f"={len(sizes)}Q", *sizes), threads=0)
        except zstandard.ZstdError as exc:
            raise CodecError(f"zstd frame is damaged: {exc}") from exc
        parts = [memoryview(decoded[index]) for index in range(len(decoded))]
        if [len(part) for part in parts] != sizes:
            raise CodecError("zstd frames decoded to the wrong lengths")
        return parts

    def _unzstd(self, frame: memoryview, length: int) -> bytes:
        try:
            data = self._decompressor().decompress(frame, max_output_size=length)
        except zstandard.ZstdError as exc:
            raise CodecError(f"zstd frame is damaged: {exc}") from exc
        if len(data) != length:
            raise CodecError(f"zstd frame decoded to {len(data)} bytes, expected {length}")
        return data


def _huffman_frames(view: memoryview) -> tuple[PlaneEntry, memoryview] | None:
    """The plane as Huffman-only zstd frames, one table for the whole plane; None: it has no table.

    The same frames as zstd makes of an exponent plane where it finds no matches (and the
    ones the GPU engine makes), without zstd's search for matches and a table per frame:
    faster, and a little smaller, as the frames share one table.
    """
    frames = -(-len(view) // FRAME_SIZE)
    out = np.empty(len(view) + 16 * frames, dtype=np.uint8)
    lengths = huffman.encode_frames(view, FRAME_SIZE, out)
    if lengths is None:
        return None
    stored = sum(lengths)
    return PlaneEntry(Codec.ZSTD_FRAMES, stored, FRAME_SIZE, tuple(lengths)), memoryview(out)[:stored]


def looks_random(plane: np.ndarray) -> bool:
    """Whether samples from the start, middle and end of a plane are near-random bytes.

    Mantissa planes are; trying zstd on them costs more than counting byte values.
    """
    size = RAW_TEST_SAMPLE
    middle, last = len(plane) // 2, len(plane) - size
    sample = np.concatenate((plane[:size], plane[middle : middle + size], plane[last:]))
    return sample_entropy(np.bincount(sample, minlength=256)) > RANDOM_BITS


def sample_entropy(counts: np.ndarray) -> float:
    """Order-0 entropy in bits per byte of a histogram of byte values."""
    probabilities = counts[counts > 0] / counts.sum()
    return float(-(probabilities * np.log2(probabilities)).sum())


def check_regions(data_length: int, regions: Sequence[Region]) -> None:
    """Refuse a region list that does not cover the chunk exactly in whole values."""
    if sum(region.length for region in regions) != data_length:
        raise CodecError("regions do not cover the chunk exactly")
    for region in regions:
        if region.length % ITEM_SIZE[region.kind]:
            raise CodecError(f"region of {region.length} bytes is not whole {region.kind.name} values")


def encode_regions(data: bytes, regions: Sequence[Region], coder: PlaneCoder) -> tuple[bytes, memoryview]:
    """Code ``data`` region by region on the CPU; returns (params, payload).

    Planes are cut straight into the payload buffer, where a plane stored raw (most mantissa
    planes) stays: no plane is copied again to join the payload. A stored plane is never
    longer than the plane, so the payload fits in as many bytes as the data.
    """
    check_regions(len(data), regions)
    entries: list[RegionEntry] = []
    payload = np.empty(len(data), dtype=np.uint8)
    view = memoryview(data)
    offset, cursor = 0, 0
    for region in regions:
        region_bytes = view[offset : offset + region.length]
        if region.kind == ElementKind.BYTES:
            codec, packed = coder.compress_bytes(region_bytes)
            planes = [PlaneEntry(codec, len(packed))]
            payload[cursor : cursor + len(packed)] = np.frombuffer(packed, dtype=np.uint8)
            cursor += len(packed)
        else:
            values = np.frombuffer(region_bytes, dtype=np.uint8).view(_UINT[ITEM_SIZE[region.kind]])
            planes, cursor = _code_float_planes(values, payload, cursor, coder)
        entries.append(RegionEntry(region.kind, region.length, tuple(planes)))
        offset += region.length
    return pack_params(entries), memoryview(payload)[:cursor]


def _code_float_planes(values: np.ndarray, payload: np.ndarray, cursor: int, coder: PlaneCoder
                       ) -> tuple[list[PlaneEntry], int]:
    """Cut and code the planes of ``values`` into ``payload`` at ``cursor``; returns them and the new cursor.

    The exponent plane, which shrinks, is cut and coded first; then the others are cut in one
    pass to where they stay when stored raw, as mantissa planes are. A plane that codes
    smaller is replaced by its frames, and the raw planes after it move down to close the
    gap: rare past the exponent plane.
    """
    count, size = len(values), values.itemsize
    planes = []
    for first, last in ((0, 0), (1, size - 1)):
        start = cursor
        cut_planes(values, first, last, payload[start : start + (last - first + 1) * count])
        for index in range(first, last + 1):
            source = start + (index - first) * count
            plane = payload[source : source + count]
            entry, packed = coder.compress_float_plane(plane)
            if entry.codec != Codec.RAW or source != cursor:  # a coded plane, or a raw one after it
                payload[cursor : cursor + entry.stored] = np.frombuffer(packed, dtype=np.uint8)
            planes.append(entry)
            cursor += entry.stored
    return planes, cursor


def planes_or_raw(data: bytes, params: bytes, payload: bytes | memoryview, codec: Codec) -> Encoded:
    """A chunk coded as planes, or stored raw where the planes (with their table) are no smaller."""
    if len(params) + len(payload) >= len(data):
        return Encoded(Codec.RAW, Transform.NONE, b"", bytes(data))
    return Encoded(codec, Transform.PLANES, params, payload)


def decode_regions(params: bytes, payload: bytes, raw_length: int, coder: PlaneCoder,
                   out: memoryview | None = None) -> memoryview:
    """Inverse of :func:`encode_regions` (any writer's planes but ANS); raises :class:`CodecError`.

    Decodes into ``out`` (``raw_length`` bytes) if given, else into a new buffer that is left
    uninitialised: the regions cover it exactly and every value is written. A ``bytearray``
    would be zeroed first, holding the GIL that the FUSE thread and the other workers wait for.

    Each region is merged whole, its framed planes joined first: merging frame by frame would
    save that copy but take a dozen numpy calls per frame, and in the daemon every numpy call
    gives up and takes back the GIL, which costs as much as the copy saves.
    """
    regions = parse_params(params, raw_length, len(payload))
    if out is not None and len(out) != raw_length:
        raise ValueError(f"an output of {len(out)} bytes for {raw_length}")
    out_view = memoryview(np.empty(raw_length, dtype=np.uint8)) if out is None else out
    source = memoryview(payload)
    offset, consumed = 0, 0
    for region in regions:
        planes = []
        for plane in region.planes:
            stored = source[consumed : consumed + plane.stored]
            planes.append(coder.decompress(plane, stored, region.plane_length))
            consumed += plane.stored
        from_planes(planes, region.kind, out_view[offset : offset + region.length])
        offset += region.length
    return out_view


def detect_regions(data: bytes, coder: PlaneCoder) -> list[Region]:
    """Guess what a chunk of unknown layout holds: the kind that codes two samples smallest."""
    view = memoryview(data)
    if len(view) < 4 * _DETECT_SAMPLE:
        return [Region(len(view), ElementKind.BYTES)]
    middle = (len(view) // 2) & ~7
    samples = [view[:_DETECT_SAMPLE], view[middle : middle + _DETECT_SAMPLE]]
    best_kind, best_size = ElementKind.BYTES, sum(len(coder.compress_bytes(sample)[1]) for sample in samples)
    for kind in _DETECT_KINDS:
        size = sum(len(encode_regions(sample, [Region(len(sample), kind)], coder)[1]) for sample in samples)
        if size < 0.99 * best_size:
            best_kind, best_size = kind, size
    return split_whole_values(len(view), best_kind)


def split_whole_values(length: int, kind: ElementKind) -> list[Region]:
    """``length`` bytes of ``kind`` values, with a trailing partial value kept as bytes."""
    whole = length - length % ITEM_SIZE[kind]
    regions = [Region(whole, kind)] if whole else []
    if whole < length:
        regions.append(Region(length - whole, ElementKind.BYTES))
    return regions
