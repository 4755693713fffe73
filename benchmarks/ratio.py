"""Compression ratio and CPU speed of nvfs's codec on real checkpoints, against zstd and a bound.

Why this benchmark: nvfs's float byte-plane transform is only worth its complexity if, on
checkpoints that real training produces, it gets close to what any coder that splits float
fields could get, and beats the obvious cheap alternatives (zstd on the raw bytes, zstd on
byte-grouped bytes) without being slower. Synthetic tensors (i.i.d. noise, constant rows)
flatter or punish a codec in ways real ones do not, so the checkpoints are made here, seeded:
a small byte-level decoder-only transformer is trained with AdamW on Python's standard
library sources, and its state is saved the ways trainers save it:

* ``train_mixed.pt``: ``torch.save`` of a mixed-precision training state (bf16 weights, fp32
  master weights, AdamW ``exp_avg`` / ``exp_avg_sq`` / ``step``, a little bookkeeping);
* ``weights_bf16.safetensors`` and ``weights_fp32.safetensors``;
* ``dcp/``: ``torch.distributed.checkpoint.save`` of the same state (one row per file).

Every file is cut into 4 MiB chunks and coded exactly as the filesystem does: one
``LayoutTracker`` per file fed the chunks in order, ``CpuEngine(level=3).encode`` per chunk,
and a stored object of 64 header bytes + params + payload. Every chunk is decoded back and
compared with the original.

The checkpoints are made by :mod:`benchmarks.ratio_checkpoints`. Run, from the repository root::

    python3 -m benchmarks.ratio            # ~5M parameters, 300 steps
    python3 -m benchmarks.ratio --quick    # smoke run

The exit status is 0 only if every acceptance check passes.
"""

from __future__ import annotations

import argparse
import io
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
import zstandard

from benchmarks.harness import cli
from benchmarks.harness.checkpoint import tensors
from benchmarks.harness.report import Check, Result, print_acceptance
from benchmarks.harness.system import load_note
from benchmarks.ratio_checkpoints import existing_checkpoints, make_checkpoints
from nvfs.codec import CpuEngine, ElementKind, Encoded
from nvfs.formats import LayoutTracker
from nvfs.store.chunk import HEADER

CHUNK = 4 << 20  # the filesystem's chunk size
ZSTD_LEVEL = 3
BOUND_TARGET = 0.97  # acceptance: nvfs must reach this fraction of the bound's ratio
# dtype -> (bits of the sign+exponent field, mantissa bits, unsigned view of the same width)
FLOAT_FIELDS: dict[torch.dtype, tuple[int, int, torch.dtype]] = {
    torch.bfloat16: (9, 7, torch.int16),
    torch.float16: (6, 10, torch.int16),
    torch.float32: (9, 23, torch.int32),
    torch.float64: (12, 52, torch.int64),
}
_NUMPY_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


# ----- what each file holds ------------------------------------------------------------------

def storages(found: Iterator[torch.Tensor]) -> list[torch.Tensor]:
    """One tensor per distinct storage, covering the whole storage.

    ``torch.save`` writes whole storages once each, however many views share them, so the
    bound must count storages, not tensors.
    """
    seen: dict[int, torch.Tensor] = {}
    for tensor in found:
        storage = tensor.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        whole = torch.empty(0, dtype=tensor.dtype)
        whole.set_(storage, 0, (storage.nbytes() // tensor.element_size(),))
        seen[storage.data_ptr()] = whole
    return list(seen.values())


def file_tensors(path: Path) -> list[torch.Tensor]:
    """The tensors stored in a checkpoint file, read back from the file itself."""
    if path.suffix == ".safetensors":
        return list(safetensors.torch.load_file(str(path)).values())
    if path.suffix == ".pt":
        return storages(t for _, t in tensors(torch.load(path, map_location="cpu", weights_only=True)))
    return dcp_file_tensors(path)


def dcp_file_tensors(path: Path) -> list[torch.Tensor]:
    """Tensors of one DCP file: the tensor items the directory's metadata places in it.

    With the default writer each item is a ``torch.save`` archive at (offset, length).
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(path.parent)).read_metadata()
    items = [info for index, info in metadata.storage_data.items()
             if info.relative_path == path.name
             and isinstance(metadata.state_dict_metadata[index.fqn], TensorStorageMetadata)]
    if not items:
        return []
    data = path.read_bytes()
    loaded = (torch.load(io.BytesIO(data[info.offset : info.offset + info.length]), weights_only=True)
              for info in items)
    return storages(t for item in loaded for _, t in tensors(item))


# ----- the bound -----------------------------------------------------------------------------

def float_bound_bits(tensor: torch.Tensor) -> float:
    """Order-0 bits of a float tensor with its fields split.

    The sign+exponent field is coded at the entropy of the tensor's own histogram; the
    mantissa is counted raw except under a zero exponent (zeros and subnormals), where it
    is counted as 0 bits.
    """
    field_bits, mantissa_bits, int_dtype = FLOAT_FIELDS[tensor.dtype]
    size = tensor.element_size()
    raw = tensor.contiguous().view(int_dtype).reshape(-1).numpy().view(_NUMPY_UINT[size])
    fields = (raw >> np.array(size * 8 - field_bits, dtype=raw.dtype)).astype(np.int64)
    counts = np.bincount(fields, minlength=1 << field_bits).astype(np.float64)
    counts = counts[counts > 0]
    entropy_bits = float(counts.sum() * math.log2(counts.sum()) - (counts * np.log2(counts)).sum())
    exponent_mask = (1 << (field_bits - 1)) - 1
    nonzero_exponent = int(np.count_nonzero(fields & exponent_mask))
    return entropy_bits + mantissa_bits * nonzero_exponent


def bound_bits(logical: int, tensors: Sequence[torch.Tensor]) -> float:
    """Bits of the whole file: floats by :func:`float_bound_bits`, everything else at 8 bits/byte."""
    tensor_bytes = sum(t.numel() * t.element_size() for t in tensors)
    if tensor_bytes > logical:
        raise AssertionError(f"tensors hold {tensor_bytes} bytes, more than the file's {logical}")
    float_bits = sum(float_bound_bits(t) for t in tensors if t.dtype in FLOAT_FIELDS)
    other_bytes = logical - sum(t.numel() * t.element_size() for t in tensors if t.dtype in FLOAT_FIELDS)
    return float_bits + 8 * other_bytes


def dominant_float_size(tensors: Sequence[torch.Tensor]) -> int:
    """Element size of the float dtype holding most of the file's bytes; 1 without floats."""
    by_size: dict[int, int] = {}
    for t in tensors:
        if t.dtype in FLOAT_FIELDS:
            by_size[t.element_size()] = by_size.get(t.element_size(), 0) + t.numel() * t.element_size()
    return max(by_size, key=by_size.__getitem__) if by_size else 1


# ----- coders --------------------------------------------------------------------------------

def split_chunks(data: bytes) -> list[bytes]:
    """The file's 4 MiB chunks, as the filesystem hands them to the engine."""
    return [data[offset : offset + CHUNK] for offset in range(0, len(data), CHUNK)]


@dataclass
class NvfsPass:
    """One nvfs encode of a file: its objects' size, time and what the layout tracker said."""

    encoded: list[Encoded]
    seconds: float
    typed_bytes: int  # bytes the tracker placed in float regions (none where it had no layout)


def nvfs_encode(chunks: Sequence[bytes], engine: CpuEngine) -> NvfsPass:
    """Encode like the filesystem: a fresh tracker fed every chunk in order, timed with it."""
    tracker = LayoutTracker()
    encoded: list[Encoded] = []
    typed = offset = 0
    start = time.perf_counter()
    for chunk in chunks:
        regions = tracker.chunk_regions(offset, chunk)
        encoded.append(engine.encode(chunk, regions))
        offset += len(chunk)
        if regions is not None:
            typed += sum(r.length for r in regions if r.kind != ElementKind.BYTES)
    return NvfsPass(encoded, time.perf_counter() - start, typed)


def nvfs_decode(encoded: Sequence[Encoded], chunks: Sequence[bytes], engine: CpuEngine) -> float:
    """Seconds to decode every chunk; then check each against the original (a mismatch is a bug)."""
    start = time.perf_counter()
    decoded = [engine.decode(item, len(chunk)) for item, chunk in zip(encoded, chunks, strict=True)]
    seconds = time.perf_counter() - start
    for index, (out, chunk) in enumerate(zip(decoded, chunks, strict=True)):
        if bytes(out) != chunk:
            raise AssertionError(f"nvfs decoded chunk {index} differs from the original")
    return seconds


def stored_size(encoded: Sequence[Encoded]) -> int:
    """Bytes of the chunk objects: 64-byte header, transform parameters, payload."""
    return sum(HEADER.size + len(e.params) + len(e.payload) for e in encoded)


def zstd_round_trip(chunks: Sequence[bytes]) -> tuple[int, float, float]:
    """zstd-3 per 4 MiB chunk: (compressed bytes, compress seconds, decompress seconds)."""
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    decompressor = zstandard.ZstdDecompressor()
    start = time.perf_counter()
    frames = [compressor.compress(chunk) for chunk in chunks]
    compress_s = time.perf_counter() - start
    start = time.perf_counter()
    for frame, chunk in zip(frames, chunks, strict=True):
        decompressor.decompress(frame, max_output_size=len(chunk))
    return sum(len(f) for f in frames), compress_s, time.perf_counter() - start


def byte_grouped_size(chunks: Sequence[bytes], group: int) -> int:
    """zstd-3 per chunk after grouping bytes by position modulo ``group`` (a byte shuffle)."""
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    total = 0
    for chunk in chunks:
        whole = len(chunk) - len(chunk) % group
        grid = np.frombuffer(chunk, dtype=np.uint8, count=whole).reshape(-1, group)
        total += len(compressor.compress(grid.T.tobytes() + chunk[whole:]))
    return total


# ----- measuring -----------------------------------------------------------------------------

@dataclass
class Row:
    """One file (or the total) of the table; times are the best of the repeats."""

    name: str
    logical: int = 0
    nvfs: int = 0
    zstd: int = 0
    grouped: int = 0
    group: int = 1
    bound_bits: float = 0.0
    typed_bytes: int = 0
    times: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIMES, 0.0))


TIMES = ("nvfs_enc", "nvfs_dec", "zstd_enc", "zstd_dec")


def measure(name: str, path: Path, engine: CpuEngine, repeats: int) -> Row:
    """Every column for one file; codecs take turns so background load hits them alike."""
    data = path.read_bytes()
    chunks = split_chunks(data)
    tensors = file_tensors(path)
    row = Row(name, logical=len(data), group=dominant_float_size(tensors),
              bound_bits=bound_bits(len(data), tensors))
    row.grouped = byte_grouped_size(chunks, row.group)
    row.times = dict.fromkeys(TIMES, math.inf)
    for _ in range(repeats):
        result = nvfs_encode(chunks, engine)
        dec_s = nvfs_decode(result.encoded, chunks, engine)
        row.zstd, zstd_enc, zstd_dec = zstd_round_trip(chunks)
        for key, seconds in zip(TIMES, (result.seconds, dec_s, zstd_enc, zstd_dec), strict=True):
            row.times[key] = min(row.times[key], seconds)
    row.nvfs = stored_size(result.encoded)
    row.typed_bytes = result.typed_bytes
    return row


def total_row(rows: Sequence[Row]) -> Row:
    """Sums of every column; ratios and speeds of the total follow from the sums."""
    total = Row("TOTAL", group=0)
    for row in rows:
        for name in ("logical", "nvfs", "zstd", "grouped", "bound_bits", "typed_bytes"):
            setattr(total, name, getattr(total, name) + getattr(row, name))
        for key in TIMES:
            total.times[key] += row.times[key]
    return total


# ----- reporting -----------------------------------------------------------------------------

def ratio(logical: int, stored: float) -> float:
    return logical / stored if stored else math.nan


def bound_ratio(row: Row) -> float:
    return ratio(8 * row.logical, row.bound_bits)


def speed(row: Row, key: str) -> float:
    """Logical MB/s (1 MB = 1e6 bytes)."""
    return row.logical / row.times[key] / 1e6 if row.times[key] else math.nan


def print_table(rows: Sequence[Row]) -> None:
    """The one table, total last."""
    header = (f"{'file':<26} {'MiB':>8} {'nvfs MiB':>9} {'nvfs x':>7} {'zstd3 x':>8} {'grp3 x':>7} "
              f"{'(k)':>3} {'bound x':>8} {'of bnd':>7} {'typed%':>6} │ {'nvfs c':>7} {'nvfs d':>7} "
              f"{'zstd c':>7} {'zstd d':>7}")
    print(header)
    print("─" * len(header))
    for row in rows:
        if row.name == "TOTAL":
            print("─" * len(header))
        nvfs_x, bnd_x = ratio(row.logical, row.nvfs), bound_ratio(row)
        group = str(row.group) if row.group else "-"
        print(f"{row.name:<26} {row.logical / 2**20:>8.2f} {row.nvfs / 2**20:>9.2f} {nvfs_x:>7.3f} "
              f"{ratio(row.logical, row.zstd):>8.3f} {ratio(row.logical, row.grouped):>7.3f} {group:>3} "
              f"{bnd_x:>8.3f} {nvfs_x / bnd_x:>7.3f} {100 * row.typed_bytes / max(1, row.logical):>6.1f} │ "
              + " ".join(f"{speed(row, key):>7.0f}" for key in TIMES))
    print(FOOTNOTES)


FOOTNOTES = """\
  x = logical / stored. nvfs MiB: chunk objects (64-byte header + params + payload), 4 MiB chunks,
    one LayoutTracker per file fed in order, CpuEngine(level=3). zstd3 / grp3: zstd level 3 frames per
    4 MiB chunk, no header. grp3: each chunk's bytes grouped by position modulo k before zstd, k = element
    size of the float dtype holding most of the file's tensor bytes (1 when the file has no floats).
  bound: order-0 bound of split float fields: per float tensor, entropy of its (sign, exponent) field
    from its own histogram (bf16 / fp32: 9 bits, fp16: 6, fp64: 12) + mantissa bits raw, except 0 bits
    for values with a zero exponent; non-float tensors and all other bytes at 8 bits/byte. Tensors are
    read back from each file (DCP: the items its .metadata places in that file).
  of bnd = nvfs x / bound x. typed% = share of the file's bytes the layout tracker put in float regions.
  Speeds: logical MB/s (1e6 B/s), one thread, best of the repeats; c = compress (nvfs: incl. layout
    tracking), d = decompress; TOTAL = all bytes / summed times."""


def file_checks(row: Row) -> list[tuple[bool | None, str]]:
    """The per-file checks as (passed, text); ``None`` where a check means nothing for the file.

    Without float tensors, grp3 is plain zstd-3 (k = 1), the very coder nvfs uses for such
    bytes, so nvfs can only tie it less its 64-byte header: that comparison is not a test.
    """
    nvfs_x, grp_x = ratio(row.logical, row.nvfs), ratio(row.logical, row.grouped)
    of_bound = nvfs_x / bound_ratio(row)
    checks: list[tuple[bool | None, str]] = [
        (of_bound >= BOUND_TARGET, f"nvfs {of_bound:.3f} of bound (>= {BOUND_TARGET})")]
    if row.group > 1:
        checks.append((nvfs_x > grp_x, f"nvfs {nvfs_x:.3f}x > grp3 {grp_x:.3f}x"))
    else:
        checks.append((None, f"nvfs {nvfs_x:.3f}x vs grp3 {grp_x:.3f}x (no float tensors: same coder)"))
    return checks


def acceptance(rows: Sequence[Row], total: Row) -> list[Check]:
    """Per file: bound fraction and byte-grouped zstd; on the total: speeds."""
    checks = [Check(f"{row.name}: {text}", ok) for row in rows for ok, text in file_checks(row)]
    for key, label in (("enc", "compress"), ("dec", "decompress")):
        nvfs_s, zstd_s = speed(total, f"nvfs_{key}"), speed(total, f"zstd_{key}")
        text = f"TOTAL {label}: nvfs {nvfs_s:.0f} MB/s >= zstd-3 {zstd_s:.0f} MB/s"
        checks.append(Check(text, nvfs_s >= zstd_s))
    return checks


# ----- main ----------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.ratio",
                                     description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=None, help="AdamW steps (default 300; --quick: 20)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="write the checkpoints here and keep them (default: a temp dir, removed)")
    parser.add_argument("--reuse", action="store_true",
                        help="measure the checkpoints already in --workdir instead of training")
    parser.add_argument("--quick", action="store_true", help="tiny model, 20 steps: a smoke run")
    parser.add_argument("--repeats", type=int, default=5, help="timing repeats, best kept (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    cli.add_json_arg(parser)
    args = parser.parse_args(argv)
    if args.reuse and args.workdir is None:
        parser.error("--reuse needs --workdir")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def run(args: argparse.Namespace, workdir: Path, result: Result) -> bool:
    """Make (or find) the checkpoints, measure every file, print the table and the verdicts."""
    paths = existing_checkpoints(workdir) if args.reuse else make_checkpoints(args, workdir)
    engine = CpuEngine(level=ZSTD_LEVEL)
    start = time.perf_counter()
    rows = [measure(str(p.relative_to(workdir)), p, engine, args.repeats) for p in paths]
    print(f"measured {len(rows)} files in {time.perf_counter() - start:.1f}s ({args.repeats} repeats)\n")
    total = total_row(rows)
    print_table([*rows, total])
    print()
    result.rows, result.acceptance = [*rows, total], acceptance(rows, total)
    return print_acceptance(result.acceptance)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    machine = cli.print_header(None, f"zstandard {zstandard.__version__}; {load_note()}")
    result = Result("ratio", args, machine)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        workdir = args.workdir
    else:
        workdir = Path(tempfile.mkdtemp(prefix="nvfs-bench-ratio-"))
    try:
        passed = run(args, workdir, result)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"\ntotal runtime {time.perf_counter() - started:.1f}s")
    result.write()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
