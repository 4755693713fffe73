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

from nvfs.codec.base import Codec, CodecError, ElementKind

_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
ITEM_SIZE = {ElementKind.BYTES: 1, ElementKind.BF16: 2, ElementKind.FP16: 2, ElementKind.FP32: 4,
             ElementKind.FP64: 8}
_COUNT = struct.Struct("<I")
_REGION = struct.Struct("<BQ")
_PLANE = struct.Struct("<BQ")
_SAMPLE = 4 << 10  # bytes per sample when deciding whether a plane is worth compressing
_RANDOM_BITS = 7.9  # a plane whose samples carry more order-0 entropy per byte is stored raw


@dataclass(frozen=True)
class Region:
    """``length`` consecutive bytes of a chunk holding values of one element kind."""

    length: int
    kind: ElementKind


def to_planes(data: memoryview, kind: ElementKind) -> list[np.ndarray]:
    """Split whole values into byte planes, most significant (exponent) plane first."""
    size = ITEM_SIZE[kind]
    raw = np.frombuffer(data, dtype=np.uint8)
    if size == 1:
        return [raw]
    values = raw.view(_UINT[size])
    bits = size * 8
    rotated = (values << 1) | (values >> (bits - 1))
    grid = rotated.view(np.uint8).reshape(-1, size)
    return [np.ascontiguousarray(grid[:, index]) for index in range(size - 1, -1, -1)]


def from_planes(planes: Sequence[bytes | np.ndarray], kind: ElementKind, out: memoryview) -> None:
    """Inverse of :func:`to_planes`, writing the values into ``out``."""
    size = ITEM_SIZE[kind]
    target = np.frombuffer(out, dtype=np.uint8)
    if size == 1:
        target[:] = np.frombuffer(planes[0], dtype=np.uint8)
        return
    grid = np.empty((len(target) // size, size), dtype=np.uint8)
    for index, plane in enumerate(planes):
        grid[:, size - 1 - index] = np.frombuffer(plane, dtype=np.uint8)
    rotated = grid.reshape(-1).view(_UINT[size])
    bits = size * 8
    np.bitwise_or(rotated >> 1, rotated << (bits - 1), out=target.view(_UINT[size]))


class PlaneCoder:
    """Codes planes with zstd or stores them raw; thread-safe (one compressor per thread)."""

    def __init__(self, level: int) -> None:
        self.level = level
        # Exponent planes are literals, not repeats: a tiny match table leaves them to the
        # Huffman stage, which is both faster and closer to the entropy than level 3
        # (bf16 weights: 0.977 of the plane's order-0 entropy at twice the speed).
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

    def compress(self, plane: np.ndarray | memoryview, *, float_plane: bool) -> tuple[Codec, bytes]:
        compressor = self._compressors()[0 if float_plane else 1]
        view = memoryview(plane).cast("B")
        if len(view) >= 4 * _SAMPLE and _looks_random(np.frombuffer(view, dtype=np.uint8)):
            return Codec.RAW, view.tobytes()
        packed = compressor.compress(view)
        if len(packed) >= len(view):
            return Codec.RAW, view.tobytes()
        return Codec.ZSTD, packed

    def decompress(self, codec: int, payload: memoryview, length: int) -> bytes | memoryview:
        if codec == Codec.RAW:
            if len(payload) != length:
                raise CodecError(f"raw plane holds {len(payload)} bytes, expected {length}")
            return payload
        if codec == Codec.ZSTD:
            try:
                data = self._decompressor().decompress(payload, max_output_size=length)
            except zstandard.ZstdError as exc:
                raise CodecError(f"zstd plane is damaged: {exc}") from exc
            if len(data) != length:
                raise CodecError(f"zstd plane decoded to {len(data)} bytes, expected {length}")
            return data
        raise CodecError(f"unknown plane codec {codec}")


def _looks_random(plane: np.ndarray) -> bool:
    """Whether samples from the start, middle and end of a plane are near-random bytes.

    Mantissa planes are; trying zstd on them costs more than counting byte values.
    """
    middle, last = len(plane) // 2, len(plane) - _SAMPLE
    sample = np.concatenate((plane[:_SAMPLE], plane[middle : middle + _SAMPLE], plane[last:]))
    counts = np.bincount(sample, minlength=256)
    probabilities = counts[counts > 0] / len(sample)
    return float(-(probabilities * np.log2(probabilities)).sum()) > _RANDOM_BITS


def encode_regions(data: bytes, regions: Sequence[Region], coder: PlaneCoder) -> tuple[bytes, bytes]:
    """Code ``data`` region by region; returns (params, payload)."""
    if sum(region.length for region in regions) != len(data):
        raise CodecError("regions do not cover the chunk exactly")
    params = [_COUNT.pack(len(regions))]
    payload: list[bytes] = []
    view = memoryview(data)
    offset = 0
    for region in regions:
        if region.length % ITEM_SIZE[region.kind]:
            raise CodecError(f"region of {region.length} bytes is not whole {region.kind.name} values")
        params.append(_REGION.pack(region.kind, region.length))
        float_planes = region.kind != ElementKind.BYTES
        for plane in to_planes(view[offset : offset + region.length], region.kind):
            codec, packed = coder.compress(plane, float_plane=float_planes)
            params.append(_PLANE.pack(codec, len(packed)))
            payload.append(packed)
        offset += region.length
    return b"".join(params), b"".join(payload)


def decode_regions(params: bytes, payload: bytes, raw_length: int, coder: PlaneCoder) -> bytearray:
    """Inverse of :func:`encode_regions`; raises :class:`CodecError` on any inconsistency."""
    out = bytearray(raw_length)
    out_view, source = memoryview(out), memoryview(payload)
    try:
        (count,) = _COUNT.unpack_from(params, 0)
        cursor, offset, consumed = _COUNT.size, 0, 0
        for _ in range(count):
            kind_value, length = _REGION.unpack_from(params, cursor)
            cursor += _REGION.size
            kind = ElementKind(kind_value)
            size = ITEM_SIZE[kind]
            if length % size or offset + length > raw_length:
                raise CodecError("region table does not fit the chunk")
            planes = []
            for _ in range(size):
                codec, stored = _PLANE.unpack_from(params, cursor)
                cursor += _PLANE.size
                if consumed + stored > len(source):
                    raise CodecError("plane lengths exceed the payload")
                planes.append(coder.decompress(codec, source[consumed : consumed + stored], length // size))
                consumed += stored
            from_planes(planes, kind, out_view[offset : offset + length])
            offset += length
    except (struct.error, ValueError) as exc:
        raise CodecError(f"transform parameters are damaged: {exc}") from exc
    if offset != raw_length or consumed != len(source) or cursor != len(params):
        raise CodecError("regions do not add up to the chunk")
    return out
