"""CPU engine: zstd through the ``zstandard`` package, plus the float byte-plane transform.

zstandard and numpy release the GIL while they work, so the store's worker threads
compress and decompress chunks in parallel. Compressor objects are not thread-safe: each
thread keeps its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from nvfs.codec.base import Codec, CodecError, ElementKind, Encoded, Transform
from nvfs.codec.planes import ITEM_SIZE, PlaneCoder, Region, decode_regions, encode_regions

_DETECT_SAMPLE = 32 << 10  # bytes per sample when guessing what a chunk holds
_DETECT_KINDS = (ElementKind.BF16, ElementKind.FP32)


class CpuEngine:
    """zstd on the CPU, with floats split into byte planes first where that pays."""

    name = "cpu"

    def __init__(self, level: int = 3) -> None:
        self.level = level
        self._coder = PlaneCoder(level)

    def encode(self, data: bytes, regions: Sequence[Region] | None = None) -> Encoded:
        if regions is None:
            regions = self._detect(data)
        if all(region.kind == ElementKind.BYTES for region in regions):
            codec, payload = self._coder.compress(memoryview(data), float_plane=False)
            return Encoded(codec, Transform.NONE, b"", payload)
        params, payload = encode_regions(data, regions, self._coder)
        if len(params) + len(payload) >= len(data):
            return Encoded(Codec.RAW, Transform.NONE, b"", bytes(data))
        return Encoded(Codec.ZSTD, Transform.PLANES, params, payload)

    def _detect(self, data: bytes) -> list[Region]:
        """Guess what a chunk of unknown layout holds: the kind that codes two samples smallest."""
        view = memoryview(data)
        if len(view) < 4 * _DETECT_SAMPLE:
            return [Region(len(view), ElementKind.BYTES)]
        middle = (len(view) // 2) & ~7
        samples = [view[:_DETECT_SAMPLE], view[middle : middle + _DETECT_SAMPLE]]
        best_kind = ElementKind.BYTES
        best_size = sum(len(encode_regions(sample, [Region(len(sample), ElementKind.BYTES)], self._coder)[1])
                        for sample in samples)
        for kind in _DETECT_KINDS:
            size = sum(len(encode_regions(sample, [Region(len(sample), kind)], self._coder)[1])
                       for sample in samples)
            if size < 0.99 * best_size:
                best_kind, best_size = kind, size
        return split_whole_values(len(view), best_kind)

    def decode(self, encoded: Encoded, raw_length: int) -> bytes | bytearray | memoryview:
        if encoded.transform == Transform.PLANES:
            return decode_regions(encoded.params, encoded.payload, raw_length, self._coder)
        if encoded.transform != Transform.NONE:
            raise CodecError(f"transform {encoded.transform} is not supported by this version")
        return self._coder.decompress(encoded.codec, memoryview(encoded.payload), raw_length)


def split_whole_values(length: int, kind: ElementKind) -> list[Region]:
    """``length`` bytes of ``kind`` values, with a trailing partial value kept as bytes."""
    whole = length - length % ITEM_SIZE[kind]
    regions = [Region(whole, kind)] if whole else []
    if whole < length:
        regions.append(Region(length - whole, ElementKind.BYTES))
    return regions
