"""Manifests: the JSON object that describes one file, directory or symlink (docs/FORMAT.md)."""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass, field

MANIFEST_FORMAT_VERSION = 1


class ManifestError(Exception):
    """A manifest that cannot be parsed or is from a newer format."""


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
    def from_json(cls, value: list) -> ChunkRef:
        chunk, length, stored, codec = value
        if not (isinstance(chunk, str) and len(chunk) == 64 and isinstance(length, int)):
            raise ManifestError(f"bad chunk entry {value!r}")
        return cls(chunk, length, int(stored), str(codec))


@dataclass
class Manifest:
    """Metadata and content map of one namespace entry.

    ``chunks[i]`` covers bytes ``[i * chunk_size, (i + 1) * chunk_size)`` of the file;
    ``None`` is a hole that reads as zeros, and a chunk shorter than its slot is padded with
    zeros up to ``size``.
    """

    kind: str  # "file", "dir" or "symlink"
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
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> Manifest:
        try:
            doc = json.loads(blob)
            version = doc["nvfs"]
            if version > MANIFEST_FORMAT_VERSION:
                raise ManifestError(f"manifest format {version} is newer than this nvfs supports")
            kind = doc["type"]
            if kind not in ("file", "dir", "symlink"):
                raise ManifestError(f"unknown entry type {kind!r}")
            chunks = [ChunkRef.from_json(c) if c is not None else None for c in doc.get("chunks", [])]
            return cls(
                kind=kind,
                mode=int(doc["mode"]),
                uid=int(doc["uid"]),
                gid=int(doc["gid"]),
                mtime_ns=int(doc["mtime_ns"]),
                ctime_ns=int(doc["ctime_ns"]),
                size=int(doc.get("size", 0)),
                chunk_size=int(doc.get("chunk_size", 0)),
                chunks=chunks,
                target=str(doc.get("target", "")),
                engine=str(doc.get("engine", "")),
            )
        except ManifestError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise ManifestError(f"unreadable manifest: {exc}") from exc


def default_dir_manifest(now_ns: int) -> Manifest:
    """Attributes for a directory that exists only as a key prefix (no marker object)."""
    return Manifest("dir", stat.S_IFDIR | 0o755, 0, 0, now_ns, now_ns)
