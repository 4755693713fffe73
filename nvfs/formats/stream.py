"""What the format parsers share: the spans they learn and the window of fed bytes they read.

A parser is fed a file's bytes in file order, chunk by chunk, and learns :class:`Span` s: byte
ranges of the file holding values of one element kind.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from nvfs.codec.base import ElementKind

MAX_HEADER = 100 << 20  # largest safetensors header or data.pkl we are willing to buffer


@dataclass(frozen=True)
class Span:
    """Bytes ``[start, end)`` of a file holding values of one kind."""

    start: int
    end: int
    kind: ElementKind


class StreamBuffer:
    """The bytes of a file from ``base`` on, as far as they have been fed.

    Fed chunks are kept by reference, not copied (the caller never changes a chunk it fed:
    the vfs feeds frozen slot buffers); only bytes a parser asks for, or still needs when the
    next chunk arrives (a header cut by the chunk boundary, a pickle so far), are copied, so
    stepping over tensor data costs nothing per byte: a copy of every chunk would be a pass
    over every byte written, on the thread that serves every FUSE request.
    """

    def __init__(self) -> None:
        self.base = 0  # file offset of carry[0]
        self.carry = b""  # copied bytes from earlier chunks, followed by chunk[at:]
        self.chunk: bytes | bytearray | memoryview = b""
        self.at = 0

    @property
    def end(self) -> int:
        return self.base + len(self.carry) + len(self.chunk) - self.at

    def feed(self, offset: int, data: bytes | bytearray | memoryview, keep_from: int) -> None:
        if offset != self.end:
            self.base, self.carry, self.chunk, self.at = offset, b"", b"", 0
        leftover = self.get(max(keep_from, self.base), max(0, self.end - max(keep_from, self.base)))
        self.base = max(keep_from, self.base) if leftover else offset
        self.carry, self.chunk, self.at = leftover, data, 0
        self.drop_before(keep_from)

    def drop_before(self, offset: int) -> None:
        if offset <= self.base:
            return
        if offset >= self.end:
            self.base, self.carry, self.chunk, self.at = offset, b"", b"", 0
            return
        cut = offset - self.base
        if cut <= len(self.carry):
            self.carry = self.carry[cut:]
        else:
            self.at += cut - len(self.carry)
            self.carry = b""
        self.base = offset

    def has(self, start: int, length: int) -> bool:
        return start >= self.base and start + length <= self.end

    def get(self, start: int, length: int) -> bytes:
        relative = start - self.base
        if relative >= len(self.carry):
            begin = self.at + relative - len(self.carry)
            return bytes(memoryview(self.chunk)[begin : begin + length])
        head = self.carry[relative : relative + length]
        return head + bytes(memoryview(self.chunk)[self.at : self.at + length - len(head)])

    def find(self, pattern: bytes, start: int, limit: int) -> int:
        """File offset of ``pattern`` in ``[start, start + limit)``, or -1."""
        start = max(start, self.base)
        relative = start - self.base
        if relative >= len(self.carry):  # within the fed chunk: search it in place
            begin = self.at + relative - len(self.carry)
            found = _find_in(self.chunk, pattern, begin, begin + limit)
            return -1 if found < 0 else start + found - begin
        window = self.get(start, min(limit, len(self.carry) - relative + len(pattern)))
        found = window.find(pattern)
        if found >= 0:
            return start + found
        return self.find(pattern, self.base + len(self.carry), limit - len(window) + len(pattern))


@functools.lru_cache(maxsize=8)
def _literal(pattern: bytes) -> re.Pattern[bytes]:
    return re.compile(re.escape(pattern))


def _find_in(data: bytes | bytearray | memoryview, pattern: bytes, start: int, end: int) -> int:
    """``data.find(pattern, start, end)`` for any bytes-like object, without a copy (the vfs
    feeds memoryviews, which have no ``find``)."""
    match = _literal(pattern).search(data, start, end)
    return match.start() if match else -1


class FormatParser:
    """A format's incremental parser: learns spans from the bytes fed to it in file order."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.known_until = 0  # every byte before this offset is accounted for
        self.stopped = False  # nothing more to learn (finished, or the bytes made no sense)

    def feed(self, offset: int, data: bytes) -> None:
        raise NotImplementedError

