"""CPU engine: zstd through the ``zstandard`` package.

zstandard releases the GIL while it works, so the store's worker threads compress and
decompress chunks in parallel. Compressor objects are not thread-safe: each thread keeps
its own.
"""

from __future__ import annotations

import threading

import zstandard

from nvfs.codec.base import Codec, CodecError, Encoded, Transform


class CpuEngine:
    """zstd on the CPU; stores a chunk raw when compression does not make it smaller."""

    name = "cpu"

    def __init__(self, level: int = 3) -> None:
        self.level = level
        self._local = threading.local()

    def _compressor(self) -> zstandard.ZstdCompressor:
        compressor = getattr(self._local, "compressor", None)
        if compressor is None:
            compressor = self._local.compressor = zstandard.ZstdCompressor(level=self.level)
        return compressor

    def _decompressor(self) -> zstandard.ZstdDecompressor:
        decompressor = getattr(self._local, "decompressor", None)
        if decompressor is None:
            decompressor = self._local.decompressor = zstandard.ZstdDecompressor()
        return decompressor

    def encode(self, data: bytes) -> Encoded:
        compressed = self._compressor().compress(data)
        if len(compressed) >= len(data):
            return Encoded(Codec.RAW, Transform.NONE, b"", bytes(data))
        return Encoded(Codec.ZSTD, Transform.NONE, b"", compressed)

    def decode(self, encoded: Encoded, raw_length: int) -> bytes:
        if encoded.transform != Transform.NONE:
            raise CodecError(f"transform {encoded.transform} is not supported by this version")
        if encoded.codec == Codec.RAW:
            return encoded.payload
        if encoded.codec == Codec.ZSTD:
            try:
                return self._decompressor().decompress(encoded.payload, max_output_size=raw_length)
            except zstandard.ZstdError as exc:
                raise CodecError(f"zstd payload is damaged: {exc}") from exc
        raise CodecError(f"codec {encoded.codec} is not supported by this version")
