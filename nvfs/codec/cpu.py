"""CPU engine: the float byte-plane transform, its planes Huffman-coded as zstd frames, zstd elsewhere.

The Huffman coder (nvfs.codec._huffman), zstandard and numpy release the GIL while they work,
so the store's worker threads compress and decompress chunks in parallel. Compressor objects
are not thread-safe: each thread keeps its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from nvfs.codec.base import Codec, CodecError, ElementKind, Encoded, Region, Transform
from nvfs.codec.planes import (
    PlaneCoder,
    PlaneEntry,
    decode_regions,
    detect_regions,
    encode_regions,
    planes_or_raw,
)


class CpuEngine:
    """zstd on the CPU, with floats split into byte planes first where that pays."""

    name = "cpu"
    rejects_damaged_input = True

    def __init__(self, level: int = 3) -> None:
        self.level = level
        self._coder = PlaneCoder(level)

    def encode(self, data: bytes, regions: Sequence[Region] | None = None) -> Encoded:
        if regions is None:
            regions = detect_regions(data, self._coder)
        if all(region.kind == ElementKind.BYTES for region in regions):
            codec, payload = self._coder.compress_bytes(memoryview(data))
            return Encoded(codec, Transform.NONE, b"", payload)
        params, payload = encode_regions(data, regions, self._coder)
        return planes_or_raw(data, params, payload, Codec.ZSTD)

    def decode(self, encoded: Encoded, raw_length: int, out: memoryview | None = None
               ) -> bytes | bytearray | memoryview:
        if encoded.transform == Transform.PLANES:
            return decode_regions(encoded.params, encoded.payload, raw_length, self._coder, out)
        if encoded.transform != Transform.NONE:
            raise CodecError(f"transform {encoded.transform} is not supported by this version")
        if encoded.codec not in (Codec.RAW, Codec.ZSTD):
            raise CodecError(f"codec {encoded.codec.name} is not valid without a transform")
        return self._coder.decompress(PlaneEntry(encoded.codec, len(encoded.payload)),
                                      memoryview(encoded.payload), raw_length)
