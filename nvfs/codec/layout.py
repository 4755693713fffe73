"""What the bytes of a checkpoint file hold, learned from the file as it is written.

Checkpoint formats say where each tensor lies and of what dtype:

- safetensors: an 8-byte header length, a JSON header with ``dtype`` and ``data_offsets``
  per tensor, then the data;
- ``torch.save`` zip files: ``data.pkl`` comes first and names every storage with its type
  and element count; each storage follows as a stored (uncompressed) zip entry
  ``<archive>/data/<key>``. The pickle is read by an unpickler that resolves every global
  to an inert stand-in, so reading it executes nothing.

A :class:`LayoutTracker` is fed a file's chunks in order and answers, for each chunk, the
regions it holds. Anything it cannot place (other formats, out-of-order writes) gets
``None``: the engine then guesses from the content.
"""

from __future__ import annotations

import bisect
import functools
import io
import json
import pickle
import re
import struct
from dataclasses import dataclass
from operator import attrgetter

from nvfs.codec.base import ElementKind
from nvfs.codec.planes import ITEM_SIZE, Region

_MAX_HEADER = 100 << 20  # largest safetensors header or data.pkl we are willing to buffer
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_SIGNATURE = b"PK\x03\x04"
_DESCRIPTOR_SIGNATURE = b"PK\x07\x08"
_CENTRAL_SIGNATURE = b"PK\x01\x02"
_END_SIGNATURES = (_CENTRAL_SIGNATURE, b"PK\x05\x06", b"PK\x06\x06")
# Records after the entries: their signature -> (fixed length, offset and width of the
# variable part's length fields). torch.distributed.checkpoint writes many torch.save
# archives back to back, so after one archive's end record another may begin.
_TRAILER_RECORDS = {
    _CENTRAL_SIGNATURE: (46, ((28, 2), (30, 2), (32, 2))),
    b"PK\x06\x06": (12, ((4, 8),)),
    b"PK\x06\x07": (20, ()),
    b"PK\x05\x06": (22, ((20, 2),)),
}
_STORAGE_ENTRY = re.compile(r"(?:^|/)data/([^/]+)$")
_SCAN_LIMIT = 1 << 20  # small zip entries of unknown size are found by scanning this far

SAFETENSORS_KINDS = {"BF16": ElementKind.BF16, "F16": ElementKind.FP16, "F32": ElementKind.FP32,
                     "F64": ElementKind.FP64}
# torch storage class name (without "Storage") -> (element kind, bytes per element)
TORCH_STORAGES = {
    "BFloat16": (ElementKind.BF16, 2), "Half": (ElementKind.FP16, 2), "Float": (ElementKind.FP32, 4),
    "Double": (ElementKind.FP64, 8), "Long": (ElementKind.BYTES, 8), "Int": (ElementKind.BYTES, 4),
    "Short": (ElementKind.BYTES, 2), "Char": (ElementKind.BYTES, 1), "Byte": (ElementKind.BYTES, 1),
    "Bool": (ElementKind.BYTES, 1), "ComplexFloat": (ElementKind.FP32, 8),
    "ComplexDouble": (ElementKind.FP64, 16), "UInt16": (ElementKind.BYTES, 2),
    "UInt32": (ElementKind.BYTES, 4), "UInt64": (ElementKind.BYTES, 8),
    "Float8_e4m3fn": (ElementKind.BYTES, 1), "Float8_e5m2": (ElementKind.BYTES, 1),
    "Float8_e4m3fnuz": (ElementKind.BYTES, 1), "Float8_e5m2fnuz": (ElementKind.BYTES, 1),
    "QInt8": (ElementKind.BYTES, 1), "QUInt8": (ElementKind.BYTES, 1), "QInt32": (ElementKind.BYTES, 4),
}


@dataclass(frozen=True)
class Span:
    """Bytes ``[start, end)`` of a file holding values of one kind."""

    start: int
    end: int
    kind: ElementKind


class _Buffer:
    """The bytes of a file from ``base`` on, as far as they have been fed.

    Fed chunks are kept by reference, not copied (the caller never changes a chunk it fed:
    the vfs feeds frozen slot buffers); only bytes a parser asks for, or still needs when the
    next chunk arrives (a header cut by the chunk boundary, a pickle so far), are copied, so
    stepping over tensor data costs nothing per byte. A copy of every chunk cost 0.56 ms per
    4 MiB on the thread that serves every FUSE request.
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


class _Parser:
    """A format's incremental parser: learns spans from the bytes fed to it in file order."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.known_until = 0  # every byte before this offset is accounted for
        self.stopped = False  # nothing more to learn (finished, or the bytes made no sense)

    def feed(self, offset: int, data: bytes) -> None:
        raise NotImplementedError


class _SafetensorsParser(_Parser):
    def __init__(self, header_length: int) -> None:
        super().__init__()
        self._header_length = header_length
        self._buffer = _Buffer()

    def feed(self, offset: int, data: bytes) -> None:
        if self.stopped:
            return
        self._buffer.feed(offset, data, 0)
        if not self._buffer.has(0, 8 + self._header_length):
            return
        try:
            header = json.loads(self._buffer.get(8, self._header_length))
            base = 8 + self._header_length
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                begin, end = info["data_offsets"]
                kind = SAFETENSORS_KINDS.get(info["dtype"], ElementKind.BYTES)
                self.spans.append(Span(base + int(begin), base + int(end), kind))
        except (ValueError, KeyError, TypeError):
            self.stopped = True
            return
        self.spans.sort(key=lambda span: span.start)
        self.known_until = 1 << 62  # the header describes the whole file
        self.stopped = True
        self._buffer = _Buffer()


class _Inert:
    """Stands in for every global a checkpoint pickle names; calling it does nothing."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> _Inert:
        return _Inert()

    def __setstate__(self, state: object) -> None:
        pass

    def __setitem__(self, key: object, value: object) -> None:
        pass

    def append(self, value: object) -> None:
        pass

    def extend(self, values: object) -> None:
        pass


class _StorageUnpickler(pickle.Unpickler):
    """Collects ``storage key -> (kind, bytes)`` from ``data.pkl`` without running any code."""

    def __init__(self, stream: io.BytesIO) -> None:
        super().__init__(stream)
        self.storages: dict[str, tuple[ElementKind, int]] = {}

    def find_class(self, module: str, name: str) -> type:
        if module == "torch" and name.endswith("Storage"):
            return type(name, (_Inert,), {"storage_name": name[: -len("Storage")]})
        return _Inert

    def persistent_load(self, pid: object) -> object:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
            storage_type, key, _location, numel = pid[1:5]
            kind_size = TORCH_STORAGES.get(getattr(storage_type, "storage_name", ""))
            if kind_size is not None and isinstance(numel, int):
                self.storages[str(key)] = (kind_size[0], numel * kind_size[1])
        return _Inert()


class _TorchZipParser(_Parser):
    """Walks the local headers of a ``torch.save`` zip file as it streams in."""

    def __init__(self) -> None:
        super().__init__()
        self._buffer = _Buffer()
        self._storages: dict[str, tuple[ElementKind, int]] = {}
        self._entry_end: int | None = None  # set while the data of an entry is being skipped

    def feed(self, offset: int, data: bytes) -> None:
        if self.stopped:
            return
        # Inside an entry's data only the bytes from its end on matter: skip the rest uncopied.
        self._buffer.feed(offset, data, self._entry_end if self._entry_end is not None else self.known_until)
        try:
            while self._step():
                pass
        except (ValueError, struct.error):
            self.stopped = True

    def _step(self) -> bool:
        """Parse the next record if its bytes are here; return whether to go on."""
        if self._entry_end is not None:
            return self._after_entry(self._entry_end)
        position = self.known_until
        if not self._buffer.has(position, 4):
            return False
        signature = self._buffer.get(position, 4)
        if signature in _TRAILER_RECORDS:
            return self._skip_trailer_record(position, signature)
        if signature != _LOCAL_SIGNATURE:
            raise ValueError("not a zip local header")
        if not self._buffer.has(position, _LOCAL_HEADER.size):
            return False
        fields = _LOCAL_HEADER.unpack(self._buffer.get(position, _LOCAL_HEADER.size))
        method, name_length, extra_length = fields[3], fields[9], fields[10]
        if method != 0:
            raise ValueError("compressed zip entry: not a torch.save file")
        if not self._buffer.has(position, _LOCAL_HEADER.size + name_length):
            return False
        name = self._buffer.get(position + _LOCAL_HEADER.size, name_length).decode(errors="replace")
        return self._entry(name, position + _LOCAL_HEADER.size + name_length + extra_length)

    def _skip_trailer_record(self, position: int, signature: bytes) -> bool:
        """Step over a central directory or end record (the archive's storages end with it)."""
        fixed, variable_fields = _TRAILER_RECORDS[signature]
        if not self._buffer.has(position, fixed):
            return False
        record = self._buffer.get(position, fixed)
        length = fixed + sum(int.from_bytes(record[at : at + width], "little")
                             for at, width in variable_fields)
        if signature == b"PK\x05\x06":
            self._storages = {}  # a following archive numbers its storages anew
        self.known_until = position + length
        self._buffer.drop_before(self.known_until)
        return True

    def _entry(self, name: str, data_start: int) -> bool:
        if name.endswith("data.pkl"):
            return self._pickle(data_start)
        match = _STORAGE_ENTRY.search(name)
        if match and match.group(1) in self._storages:
            kind, length = self._storages[match.group(1)]
            self.spans.append(Span(data_start, data_start + length, kind))
            return self._after_entry(data_start + length)
        return self._scan_small_entry(data_start)

    def _pickle(self, data_start: int) -> bool:
        """Read ``data.pkl`` once all of it is here; try growing windows, as pickles are small."""
        available = self._buffer.end - data_start
        window = 64 << 10
        while available > 0:
            size = min(window, available)
            stream = io.BytesIO(self._buffer.get(data_start, size))
            unpickler = _StorageUnpickler(stream)
            try:
                unpickler.load()
            except (EOFError, pickle.UnpicklingError, IndexError, struct.error):
                if size < available:
                    window *= 4
                    continue
                if available > _MAX_HEADER:
                    raise ValueError("data.pkl is too large") from None
                return False  # incomplete so far
            self._storages = unpickler.storages
            return self._after_entry(data_start + stream.tell())
        return False

    def _scan_small_entry(self, data_start: int) -> bool:
        """Find the data descriptor of an entry whose size only the descriptor states."""
        window = self._buffer.end - data_start
        search_from = data_start
        while True:
            descriptor = self._buffer.find(_DESCRIPTOR_SIGNATURE, search_from, _SCAN_LIMIT)
            if descriptor < 0:
                if window > _SCAN_LIMIT:
                    raise ValueError("zip entry of unknown size is too large to scan")
                return False
            if not self._buffer.has(descriptor, 12):
                return False
            (size,) = struct.unpack("<I", self._buffer.get(descriptor + 8, 4))
            if size == descriptor - data_start:
                return self._after_entry(descriptor)
            search_from = descriptor + 1

    def _after_entry(self, end: int) -> bool:
        """Step over the data descriptor that follows an entry's data, to the next record."""
        self._entry_end = end
        if not self._buffer.has(end, 28):
            # The entry's data is accounted for as far as it has arrived; wait for the rest.
            self.known_until = max(self.known_until, min(end, self._buffer.end))
            self._buffer.drop_before(self.known_until)
            return False
        if self._buffer.get(end, 4) != _DESCRIPTOR_SIGNATURE:
            raise ValueError("missing zip data descriptor")
        for descriptor_length in (16, 24):  # zip32 or zip64 sizes
            following = self._buffer.get(end + descriptor_length, 4)
            if following == _LOCAL_SIGNATURE or following in _END_SIGNATURES:
                self._entry_end = None
                self.known_until = end + descriptor_length
                self._buffer.drop_before(self.known_until)
                return True
        raise ValueError("unexpected bytes after a zip data descriptor")


def _parser_for(head: bytes) -> _Parser | None:
    if head.startswith(_LOCAL_SIGNATURE):
        return _TorchZipParser()
    if len(head) >= 9 and head[8:9] == b"{":
        (header_length,) = struct.unpack_from("<Q", head)
        if header_length <= _MAX_HEADER:
            return _SafetensorsParser(header_length)
    return None


class LayoutTracker:
    """Follows one file's layout as its chunks are stored, first to last."""

    def __init__(self) -> None:
        self._parser: _Parser | None = None
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
        return _regions(parser.spans, offset, offset + len(data))


def _regions(spans: list[Span], start: int, end: int) -> list[Region]:
    """Partition ``[start, end)`` into regions: whole values of known spans, bytes elsewhere.

    Spans are sorted and do not overlap, so their ends are sorted too: the first one that
    reaches into the chunk is found by bisection. Scanning from the first span made a file
    of n tensors cost O(n) per chunk on the thread that serves FUSE requests (20,000 spans:
    0.46 ms per chunk).
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
