"""Manifests: the JSON object that describes one namespace entry (docs/FORMAT.md).

A manifest comes from the store, which anyone with write access to the bucket or the
backing directory can edit: :meth:`Manifest.from_bytes` checks every field before anything
is built from it (chunk ids become object keys and cache paths; sizes become allocations).
"""

from __future__ import annotations

import json
import re
import stat
from dataclasses import dataclass, field

MANIFEST_FORMAT_VERSION = 1
CHUNK_ID_LENGTH = 64  # hex digits of the store's 32-byte hash (BLAKE3 or SHA-256)
# Slot sizes a manifest may declare: -o chunk_size takes 64 KiB to 64 MiB; the wider range
# leaves room for other writers without letting a slot size stand for an allocation.
MIN_CHUNK_SIZE = 4 << 10
MAX_CHUNK_SIZE = 1 << 30
MAX_FILE_SIZE = (1 << 63) - 1  # off_t
_MAX_ID = (1 << 32) - 1  # uid_t, gid_t
_CHUNK_ID = re.compile(rf"[0-9a-f]{{{CHUNK_ID_LENGTH}}}")
# File-type bits each kind may carry in ``mode`` (0: none given; the vfs adds the kind's own)
_TYPE_BITS = {
    "file": (0, stat.S_IFREG),
    "dir": (0, stat.S_IFDIR),
    "symlink": (0, stat.S_IFLNK),
    "special": (stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK),
}
KINDS = tuple(_TYPE_BITS)


class ManifestError(Exception):
    """A manifest that cannot be parsed, breaks the format's rules or is from a newer format."""


def is_chunk_id(value: object) -> bool:
    """Whether ``value`` is a chunk id: lowercase hex of exactly the hash's length."""
    return isinstance(value, str) and _CHUNK_ID.fullmatch(value) is not None


def _integer(value: object, what: str, low: int = 0, high: int = MAX_FILE_SIZE) -> int:
    """``value`` if it is an int (not a bool) in ``[low, high]``; else :class:`ManifestError`."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ManifestError(f"bad {what} {value!r}")
    return value


@dataclass(frozen=True)
class ChunkRef:
    """One stored chunk: its content address, uncompressed and stored lengths, and codec."""

    id: str
    length: int
    stored: int
    codec: str

    def to_json(self) -> list:
        return [self.id, self.length, self.stored, self.codec]

    @classmethod
    def from_json(cls, value: object) -> ChunkRef:
        if not isinstance(value, list) or len(value) != 4:
            raise ManifestError(f"bad chunk entry {value!r:.200}")
        chunk, length, stored, codec = value
        if not is_chunk_id(chunk):
            raise ManifestError(f"bad chunk id {chunk!r:.200}")
        if not isinstance(codec, str):
            raise ManifestError(f"bad codec {codec!r:.200} of chunk {chunk}")
        return cls(chunk, _integer(length, "chunk length"), _integer(stored, "stored chunk size"), codec)


@dataclass
class Manifest:
    """Metadata and content map of one namespace entry.

    ``chunks[i]`` covers bytes ``[i * chunk_size, (i + 1) * chunk_size)`` of the file;
    ``None`` is a hole that reads as zeros, and a chunk shorter than its slot is padded with
    zeros up to ``size``. A ``special`` entry (fifo, socket, character or block device) has
    its type in ``mode`` and, for a device, its number in ``rdev``; it has no content.
    """

    kind: str  # "file", "dir", "symlink" or "special"
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    ctime_ns: int
    size: int = 0
    chunk_size: int = 0
    chunks: list[ChunkRef | None] = field(default_factory=list)
    target: str = ""
    engine: str = ""
    rdev: int = 0

    def stored_size(self) -> int:
        return sum(ref.stored for ref in self.chunks if ref is not None)

    def codecs(self) -> str:
        names = sorted({ref.codec for ref in self.chunks if ref is not None})
        return ",".join(names) if names else "none"

    def to_bytes(self) -> bytes:
        doc: dict = {
            "nvfs": MANIFEST_FORMAT_VERSION,
            "type": self.kind,
            "mode": self.mode,
            "uid": self.uid,
            "gid": self.gid,
            "mtime_ns": self.mtime_ns,
            "ctime_ns": self.ctime_ns,
        }
        if self.kind == "file":
            doc.update(
                size=self.size,
                chunk_size=self.chunk_size,
                stored_size=self.stored_size(),
                engine=self.engine,
                chunks=[ref.to_json() if ref else None for ref in self.chunks],
            )
        elif self.kind == "symlink":
            doc["target"] = self.target
        elif self.kind == "special":
            doc["rdev"] = self.rdev
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> Manifest:
        """Parse and check a manifest; anything that breaks the format is a :class:`ManifestError`."""
        try:
            doc = json.loads(blob)
            if not isinstance(doc, dict):
                raise ManifestError("a manifest is a JSON object")
            version = _integer(doc["nvfs"], "format version")
            if version > MANIFEST_FORMAT_VERSION:
                raise ManifestError(f"manifest format {version} is newer than this nvfs supports")
            kind = doc["type"]
            if kind not in KINDS:
                raise ManifestError(f"unknown entry type {kind!r:.200}")
            chunks = doc.get("chunks", [])
            if not isinstance(chunks, list):
                raise ManifestError("chunks is not a list")
            manifest = cls(
                kind=kind,
                mode=_integer(doc["mode"], "mode", high=0o177777),
                uid=_integer(doc["uid"], "uid", high=_MAX_ID),
                gid=_integer(doc["gid"], "gid", high=_MAX_ID),
                mtime_ns=_integer(doc["mtime_ns"], "mtime_ns", low=-MAX_FILE_SIZE),
                ctime_ns=_integer(doc["ctime_ns"], "ctime_ns", low=-MAX_FILE_SIZE),
                size=_integer(doc.get("size", 0), "size"),
                chunk_size=_integer(doc.get("chunk_size", 0), "chunk_size", high=MAX_CHUNK_SIZE),
                chunks=[ChunkRef.from_json(c) if c is not None else None for c in chunks],
                target=str(doc.get("target", "")),
                engine=str(doc.get("engine", "")),
                rdev=_integer(doc.get("rdev", 0), "rdev", high=(1 << 64) - 1),
            )
        except ManifestError:
            raise
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ManifestError(f"unreadable manifest: {exc}") from exc
        manifest.check()
        return manifest

    def check(self) -> None:
        """Raise :class:`ManifestError` unless type bits, size, slot size and chunks agree."""
        if stat.S_IFMT(self.mode) not in _TYPE_BITS[self.kind]:
            raise ManifestError(f"mode {self.mode:o} does not fit entry type {self.kind}")
        # 0: no slot size of its own (a file of holes only); the mount's applies
        if self.chunk_size and not MIN_CHUNK_SIZE <= self.chunk_size <= MAX_CHUNK_SIZE:
            raise ManifestError(f"chunk_size {self.chunk_size} is outside "
                                f"[{MIN_CHUNK_SIZE}, {MAX_CHUNK_SIZE}]")
        stored = [index for index, ref in enumerate(self.chunks) if ref is not None]
        if not stored:
            return  # holes only: trailing holes are what readers assume anyway
        if not self.chunk_size:
            raise ManifestError("chunks without a chunk_size")
        needed = -(-self.size // self.chunk_size)
        if stored[-1] >= needed:
            raise ManifestError(f"chunk {stored[-1]} lies past the end of {self.size} bytes "
                                f"in slots of {self.chunk_size}")
        for ref in self.chunks:
            if ref is not None and ref.length > self.chunk_size:
                raise ManifestError(f"chunk {ref.id} of {ref.length} bytes is longer than "
                                    f"chunk_size {self.chunk_size}")


def default_dir_manifest(now_ns: int) -> Manifest:
    """Attributes for a directory that exists only as a key prefix (no marker object)."""
    return Manifest("dir", stat.S_IFDIR | 0o755, 0, 0, now_ns, now_ns)
