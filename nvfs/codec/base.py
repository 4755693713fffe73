"""The codec interface shared by every engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

import numpy as np


class CodecError(Exception):
    """Input that an engine cannot encode or decode (unknown codec, damaged payload)."""


class Codec(IntEnum):
    """Entropy coder of a chunk payload (or of each plane); the numbers are on-disk format."""

    RAW = 0
    ZSTD = 1  # one standard zstd frame
    ZSTD_FRAMES = 2  # planes only: standard zstd frames of a fixed decoded size, lengths in the table
    ANS = 3  # planes only: nvCOMP ANS frames (a GPU-only coder), laid out as ZSTD_FRAMES


class Transform(IntEnum):
    """Reversible transform applied before the entropy coder; the numbers are on-disk format."""

    NONE = 0
    PLANES = 1  # regions of values split into byte planes, each coded on its own


class ElementKind(IntEnum):
    """What the bytes of a region hold; the numbers are on-disk format."""

    BYTES = 0  # anything that is not a float we split: ints, fp8, metadata, unknown
    BF16 = 1
    FP16 = 2
    FP32 = 3
    FP64 = 4


ITEM_SIZE = {ElementKind.BYTES: 1, ElementKind.BF16: 2, ElementKind.FP16: 2, ElementKind.FP32: 4,
             ElementKind.FP64: 8}
_ITEM_SIZES = np.zeros(max(int(kind) for kind in ITEM_SIZE) + 1, dtype=np.int64)  # by ElementKind value
for _kind, _size in ITEM_SIZE.items():
    _ITEM_SIZES[int(_kind)] = _size


def item_sizes(kinds: np.ndarray) -> np.ndarray:
    """:data:`ITEM_SIZE` of each of an array of element kind values, in one numpy step."""
    return _ITEM_SIZES[kinds]


@dataclass(frozen=True)
class Region:
    """``length`` consecutive bytes of a chunk holding values of one element kind."""

    length: int
    kind: ElementKind


@dataclass(frozen=True)
class Encoded:
    """One encoded chunk payload and everything needed to decode it."""

    codec: Codec
    transform: Transform
    params: bytes
    payload: bytes | memoryview  # a view into the stored object when decoding

    @property
    def name(self) -> str:
        """How manifests and ``nvfs stat`` name the encoding: ``zstd``, ``planes+zstd``, ..."""
        codec = self.codec.name.lower()
        return codec if self.transform == Transform.NONE else f"{self.transform.name.lower()}+{codec}"


class Engine(Protocol):
    """Compresses and decompresses chunk payloads. Implementations must be thread-safe."""

    name: str
    # Whether decode() reports damaged payloads as CodecError (the CPU decoders do); if not,
    # the store checks the chunk's CRC before handing it over.
    rejects_damaged_input: bool

    def encode(self, data: bytes, regions: Sequence[Region] | None = None) -> Encoded:
        """Encode ``data``; ``regions`` (covering it exactly) say what the bytes hold, if known.

        Payloads that would not shrink come back as ``Codec.RAW``.
        """
        ...

    def decode(self, encoded: Encoded, raw_length: int, out: memoryview | None = None
               ) -> bytes | bytearray | memoryview:
        """Return the original bytes; raise :class:`CodecError` on a damaged payload.

        ``out`` (``raw_length`` bytes), if given, is where the engine may decode to: then it
        returns ``out`` itself. Any other result is a buffer of its own.
        """
        ...
