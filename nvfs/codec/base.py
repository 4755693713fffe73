"""The codec interface shared by every engine."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol


class CodecError(Exception):
    """Input that an engine cannot encode or decode (unknown codec, damaged payload)."""


class Codec(IntEnum):
    """Entropy coder of a chunk payload; the numbers are part of the on-disk format."""

    RAW = 0
    ZSTD = 1


class Transform(IntEnum):
    """Reversible byte transform applied before the entropy coder; numbers are on-disk format.

    Only the identity exists in format 1; float-aware transforms (issue 3) get new numbers
    and carry their parameters in :attr:`Encoded.params`.
    """

    NONE = 0


@dataclass(frozen=True)
class Encoded:
    """One encoded chunk payload and everything needed to decode it."""

    codec: Codec
    transform: Transform
    params: bytes
    payload: bytes


class Engine(Protocol):
    """Compresses and decompresses chunk payloads. Implementations must be thread-safe."""

    name: str

    def encode(self, data: bytes) -> Encoded:
        """Encode ``data``; payloads that would not shrink come back as ``Codec.RAW``."""
        ...

    def decode(self, encoded: Encoded, raw_length: int) -> bytes:
        """Return the original bytes; raise :class:`CodecError` on a damaged payload."""
        ...
