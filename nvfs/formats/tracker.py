"""Which regions of each chunk hold which element kind, from a file's format parser.

A :class:`LayoutTracker` is fed a file's chunks in order and answers, for each chunk, the
regions it holds. Anything it cannot place (other formats, out-of-order writes) gets
``None``: the engine then guesses from the content.
"""

from __future__ import annotations

import bisect
import struct
from operator import attrgetter

from nvfs.codec.base import ITEM_SIZE, ElementKind, Region
from nvfs.formats.safetensors import SafetensorsParser
from nvfs.formats.stream import MAX_HEADER, FormatParser, Span
from nvfs.formats.torch_zip import LOCAL_SIGNATURE, TorchZipParser


def _parser_for(head: bytes) -> FormatParser | None:
    """The parser for a file starting with ``head`` (its first 16 bytes); None: a format we do not know."""
    if head.startswith(LOCAL_SIGNATURE):
        return TorchZipParser()
    if len(head) >= 9 and head[8:9] == b"{":
        (header_length,) = struct.unpack_from("<Q", head)
        if header_length <= MAX_HEADER:
            return SafetensorsParser(header_length)
    return None


class LayoutTracker:
    """Follows one file's layout as its chunks are stored, first to last."""

    def __init__(self) -> None:
        self._parser: FormatParser | None = None
        self._expected = 0
        self._in_order = True

    def chunk_regions(self, offset: int, data: bytes | bytearray | memoryview) -> list[Region] | None:
        """Feed the chunk at ``offset``; return its regions, or ``None`` if they are unknown.

        ``data`` is kept by reference until the next chunk is fed: it must not change.
        """
        if offset != self._expected:
            self._in_order = False
        if self._in_order:
            if offset == 0:
                self._parser = _parser_for(bytes(data[:16]))
            if self._parser is not None:
                self._parser.feed(offset, data)
            self._expected = offset + len(data)
        parser = self._parser
        if parser is None or parser.known_until < offset + len(data):
            return None
        return span_regions(parser.spans, offset, offset + len(data))


def span_regions(spans: list[Span], start: int, end: int) -> list[Region]:
    """Partition ``[start, end)`` into regions: whole values of known spans, bytes elsewhere.

    Spans are sorted and do not overlap, so their ends are sorted too: the first one that
    reaches into the chunk is found by bisection. Scanning from the first span would make a
    file of n tensors cost O(n) per chunk, O(n^2) in all, on the thread that serves FUSE
    requests.
    """
    regions: list[Region] = []
    cursor = start
    for index in range(bisect.bisect_right(spans, start, key=attrgetter("end")), len(spans)):
        span = spans[index]
        if span.kind == ElementKind.BYTES:
            continue
        if span.start >= end:
            break
        size = ITEM_SIZE[span.kind]
        first = max(span.start, start)
        first += (span.start - first) % size  # next value boundary at or after the chunk start
        last = min(span.end, end)
        last -= (last - first) % size if last > first else 0
        if last <= first:
            continue
        if first > cursor:
            regions.append(Region(first - cursor, ElementKind.BYTES))
        regions.append(Region(last - first, span.kind))
        cursor = last
    if not any(region.kind != ElementKind.BYTES for region in regions):
        return [Region(end - start, ElementKind.BYTES)]
    if cursor < end:
        regions.append(Region(end - cursor, ElementKind.BYTES))
    return _coalesce(regions)


_MERGE_GAP = 4096  # zip records between two small tensors of one dtype are coded with them
_SMALL_REGION = 256 << 10


def _coalesce(regions: list[Region]) -> list[Region]:
    """Merge ``small kind, small gap, kind`` into one region: fewer, larger planes code faster.

    The transform is exact for any bytes, so a few header bytes coded as floats cost a
    few bytes at most, while every region boundary costs a zstd frame per plane. Large
    tensors keep planes of their own: their statistics differ (Adam's m and v do).
    """
    merged: list[Region] = []
    for region in regions:
        if len(merged) >= 2 and region.kind != ElementKind.BYTES:
            gap, before = merged[-1], merged[-2]
            if (gap.kind == ElementKind.BYTES and before.kind == region.kind and gap.length <= _MERGE_GAP
                    and gap.length % ITEM_SIZE[region.kind] == 0
                    and min(before.length, region.length) < _SMALL_REGION):
                merged[-2:] = [Region(before.length + gap.length + region.length, region.kind)]
                continue
        merged.append(region)
    return merged
