"""safetensors: an 8-byte header length, a JSON header with ``dtype`` and ``data_offsets``
per tensor, then the data."""

from __future__ import annotations

import json

from nvfs.codec.base import ElementKind
from nvfs.formats.stream import FormatParser, Span, StreamBuffer

SAFETENSORS_KINDS = {"BF16": ElementKind.BF16, "F16": ElementKind.FP16, "F32": ElementKind.FP32,
                     "F64": ElementKind.FP64}


class SafetensorsParser(FormatParser):
    """Reads the JSON header once all of it is here: it describes the whole file."""

    def __init__(self, header_length: int) -> None:
        super().__init__()
        self._header_length = header_length
        self._buffer = StreamBuffer()

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
        self._buffer = StreamBuffer()

