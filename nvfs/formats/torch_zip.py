"""``torch.save`` zip files: where each storage lies, and of which dtype.

``data.pkl`` comes first and names every storage with its type and element count; each
storage follows as a stored (uncompressed) zip entry ``<archive>/data/<key>``. The pickle is
read by an unpickler that resolves every global to an inert stand-in, so reading it executes
nothing.
"""

from __future__ import annotations

import io
import pickle
import re
import struct

from nvfs.codec.base import ElementKind
from nvfs.formats.stream import MAX_HEADER, FormatParser, Span, StreamBuffer

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
LOCAL_SIGNATURE = b"PK\x03\x04"
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


class TorchZipParser(FormatParser):
    """Walks the local headers of a ``torch.save`` zip file as it streams in."""

    def __init__(self) -> None:
        super().__init__()
        self._buffer = StreamBuffer()
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
        if signature != LOCAL_SIGNATURE:
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
                if available > MAX_HEADER:
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
            if following == LOCAL_SIGNATURE or following in _END_SIGNATURES:
                self._entry_end = None
                self.known_until = end + descriptor_length
                self._buffer.drop_before(self.known_until)
                return True
        raise ValueError("unexpected bytes after a zip data descriptor")

