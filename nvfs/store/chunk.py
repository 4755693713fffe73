"""The chunk object format (see docs/FORMAT.md, "Chunk objects").

A chunk object is a fixed 64-byte header, the transform parameters, then the payload::

    0   4  magic  b"NVFC"
    4   1  format version (2; 1 had no CRC)
    5   1  codec (nvfs.codec.Codec)
    6   1  transform (nvfs.codec.Transform)
    7   1  engine that wrote it (0 cpu, 1 gpu), informational
    8   8  uncompressed length, little-endian
    16  8  payload length
    24  4  transform parameter length
    28  4  CRC-32 of everything after the header (version 2; zero in version 1)
    32  32 hash of the uncompressed bytes (also the chunk's id): the store's hash function,
           BLAKE3 or SHA-256 (the superblock's "hash")
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass

import blake3
from isal.isal_zlib import crc32  # zlib's CRC-32, nine times as fast (3 MiB: 0.05 vs 0.46 ms here)

from nvfs.codec import Codec, CodecError, Encoded, Engine, Region, Transform

MAGIC = b"NVFC"
CHUNK_FORMAT_VERSION = 2
HEADER = struct.Struct("<4sBBBBQQII32s")
ENGINE_IDS = {"cpu": 0, "gpu": 1}


class ChunkCorrupt(Exception):
    """A chunk object whose header, payload or checksum does not hold."""


@dataclass(frozen=True)
class ChunkHeader:
    codec: Codec
    transform: Transform
    engine_id: int
    raw_length: int
    payload_length: int
    params_length: int
    digest: bytes
    version: int
    crc: int


ChunkHash = Callable[[bytes | bytearray | memoryview], bytes]
"""A store's hash function: 32 bytes whose hex form is the chunk's content address."""

CHUNK_HASHES: dict[str, ChunkHash] = {
    # BLAKE3 hashes a 4 MiB chunk about five times faster than SHA-256 on one core (0.43 ms
    # vs 2.0 ms here), and it runs on every chunk written and every chunk read.
    "blake3": lambda data: blake3.blake3(data).digest(),
    "sha256": lambda data: hashlib.sha256(data).digest(),  # stores of format 1
}


def chunk_hash(name: str) -> ChunkHash:
    """The hash function called ``name`` in a superblock; KeyError names the unknown one."""
    try:
        return CHUNK_HASHES[name]
    except KeyError:
        raise KeyError(f"chunk hash {name!r} is not known (known: {', '.join(CHUNK_HASHES)})") from None


def encode_chunk(data: bytes, engine: Engine, regions: list[Region] | None,
                 digest: bytes) -> tuple[tuple[bytes, bytes | memoryview], Encoded]:
    """Build the object for ``data`` (holding ``regions``, if known, and hashing to ``digest``).

    Returns the object, as its header (with the parameters) and its payload, to be written
    back to back without joining them here, and its encoding.
    """
    encoded = engine.encode(data, regions)
    header = HEADER.pack(
        MAGIC,
        CHUNK_FORMAT_VERSION,
        encoded.codec,
        encoded.transform,
        ENGINE_IDS.get(engine.name, 0),
        len(data),
        len(encoded.payload),
        len(encoded.params),
        crc32(encoded.payload, crc32(encoded.params)),
        digest,
    )
    return (header + encoded.params, encoded.payload), encoded


def parse_header(blob: bytes | memoryview) -> ChunkHeader:
    """Read and check the header of a chunk object."""
    if len(blob) < HEADER.size:
        raise ChunkCorrupt(f"object is {len(blob)} bytes, shorter than a chunk header")
    magic, version, codec, transform, engine_id, raw, payload, params, crc, digest = HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise ChunkCorrupt(f"bad magic {magic!r}")
    if version > CHUNK_FORMAT_VERSION:
        raise ChunkCorrupt(f"chunk format {version} is newer than this nvfs supports")
    try:
        codec_value, transform_value = Codec(codec), Transform(transform)
    except ValueError as exc:
        raise ChunkCorrupt(f"unknown codec {codec} or transform {transform}") from exc
    if HEADER.size + params + payload != len(blob):
        raise ChunkCorrupt(f"lengths in header ({params}+{payload}) do not match object size {len(blob)}")
    return ChunkHeader(codec_value, transform_value, engine_id, raw, payload, params, digest, version, crc)


def decode_chunk(blob: bytes | memoryview, engine: Engine, expected_id: str, digest_of: ChunkHash,
                 expected_length: int | None = None, out: memoryview | None = None
                 ) -> bytes | bytearray | memoryview:
    """Decode a chunk object and verify, with the store's hash, that it is the chunk ``expected_id``.

    ``expected_length``: the length a manifest gives the chunk, if the caller has one.
    ``out``: where the engine may decode to, if the chunk is that long (see ``Engine.decode``).
    """
    header = parse_header(blob)
    if expected_length is not None and header.raw_length != expected_length:
        raise ChunkCorrupt(f"chunk holds {header.raw_length} bytes, manifest says {expected_length}")
    # The hash can only be checked after decoding; an engine whose decoder may fault on
    # damaged input (the GPU's) gets only bytes that passed the CRC.
    check_crc = not engine.rejects_damaged_input and header.version >= 2
    if check_crc and crc32(memoryview(blob)[HEADER.size :]) != header.crc:
        raise ChunkCorrupt("CRC mismatch: the stored bytes are damaged")
    params_end = HEADER.size + header.params_length
    payload = memoryview(blob)[params_end:]  # a view, not a copy: the payload is most of the object
    encoded = Encoded(header.codec, header.transform, bytes(blob[HEADER.size : params_end]), payload)
    try:
        data = engine.decode(encoded, header.raw_length,
                             out if out is not None and len(out) == header.raw_length else None)
    except CodecError as exc:
        raise ChunkCorrupt(str(exc)) from exc
    if len(data) != header.raw_length:
        raise ChunkCorrupt(f"decoded {len(data)} bytes, header says {header.raw_length}")
    digest = digest_of(data)
    if digest != header.digest or digest.hex() != expected_id:
        raise ChunkCorrupt("checksum mismatch")
    return data
