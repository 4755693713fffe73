"""GPU codec speed and ratio on checkpoint data: nvfs's GPU engine vs nvCOMP on raw bytes vs the CPU engine.

Run on the GPU machine (prepared by ``benchmarks/gpu_setup.sh install``), from the repository root::

    python3 -m benchmarks.gpu_codec --gib 1

Data, seeded, built on the GPU with torch: bf16 weights (normal, std 0.02) and fp32 optimizer
state (a third each of master weights, AdamW ``exp_avg`` and ``exp_avg_sq`` shaped values),
``--gib`` GiB of each, cut into 4 MiB chunks whose layout (one dtype) is known, as the mount
knows it for torch.save and safetensors files.

Rows, for each dtype, all in one run:

* ``nvfs gpu portable``: the portable format as the GPU engine writes it (planes + 64 KiB
  standard zstd frames of Huffman-coded literals from its own kernels; the CPU engine reads it);
* ``nvfs gpu ans``: ``-o codec=ans`` (planes + nvCOMP ANS frames, GPU-only);
* ``nvCOMP Zstd`` / ``nvCOMP ANS u1`` / ``nvCOMP ANS <f2|<f4``: nvCOMP called directly on the raw
  bytes in 128 KiB chunks, one batch for the whole buffer (no transform);
* ``nvfs cpu engine``: the CPU engine on every core of the machine (a thread per core).

Columns: compression ratio (chunk headers and parameters counted for nvfs), the fraction of
the order-0 entropy bound of the byte planes, and GB/s of logical bytes (1 GB = 1e9 B):
``dev`` with data already in GPU memory (compress: device in, device out; decompress likewise;
nvfs: ``encode_device_batches``/``decode_device_batches``, batches of ``BATCH_BYTES`` handed over
together, so that the host prepares one while the GPU works on another),
``host`` from host memory to host memory (nvfs: the engine's ``encode_batch``/``decode_batch``,
the path the mount uses, pinned staging copies included). Every decode is checked bit-exact.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

try:  # --help works anywhere; a run needs the GPU machine's CuPy and nvCOMP
    import cupy as cp
    from nvidia import nvcomp

    from nvfs.codec.gpu import BATCH_BYTES, GpuEngine
    from nvfs.codec.gpu_decode import batch_sizes
except ImportError as exc:
    GPU_MISSING: ImportError | None = exc
else:
    GPU_MISSING = None

from benchmarks.harness import cli
from benchmarks.harness.report import Check, Result, print_acceptance
from nvfs.codec import CpuEngine, ElementKind, Region, make_engine
from nvfs.codec.base import ITEM_SIZE
from nvfs.codec.planes import parse_params

CHUNK = 4 << 20
FRAME = 128 << 10
HEADER = 64


@dataclass
class Row:
    data: str
    method: str
    ratio: float
    bound: float
    comp_dev: float | None = None
    decomp_dev: float | None = None
    comp_host: float | None = None
    decomp_host: float | None = None


def build(kind: ElementKind, size: int, seed: int) -> cp.ndarray:
    """``size`` bytes of checkpoint-like values of ``kind`` on the GPU, as uint8."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    if kind == ElementKind.BF16:
        values = (torch.randn(size // 2, generator=generator, device="cuda") * 0.02).to(torch.bfloat16)
    else:
        third = size // 4 // 3
        master = torch.randn(third, generator=generator, device="cuda") * 0.02
        exp_avg = torch.randn(third, generator=generator, device="cuda") * 1e-4
        exp_avg_sq = (torch.randn(size // 4 - 2 * third, generator=generator, device="cuda") * 1e-4) ** 2
        values = torch.cat((master, exp_avg, exp_avg_sq))
    return cp.from_dlpack(values.view(torch.uint8).reshape(-1)).copy()


def plane_bound(data: cp.ndarray, kind: ElementKind) -> float:
    """Bytes the order-0 entropy of each byte plane (rotated values) allows, summed over planes."""
    size = ITEM_SIZE[kind]
    unsigned = {2: cp.uint16, 4: cp.uint32}[size]
    values = data.view(unsigned)
    rotated = (values << 1) | (values >> (8 * size - 1))
    grid = rotated.view(cp.uint8).reshape(-1, size)
    total = 0.0
    for index in range(size):
        counts = cp.bincount(grid[:, index], minlength=256).get()
        probabilities = counts[counts > 0] / counts.sum()
        total += float(-(probabilities * np.log2(probabilities)).sum()) * len(grid) / 8
    return total


def timed(fn: Callable[[], object], repeat: int = 3) -> tuple[float, object]:
    """Best wall time of ``repeat`` runs (after one warm-up run), the whole GPU synchronised."""
    result = fn()
    best = math.inf
    for _ in range(repeat):
        cp.cuda.Device().synchronize()
        start = time.perf_counter()
        result = fn()
        cp.cuda.Device().synchronize()
        best = min(best, time.perf_counter() - start)
    return best, result


def bench_engine(engine: GpuEngine, data: cp.ndarray, kind: ElementKind, label: str, bound: float) -> Row:
    size = data.size
    chunks = size // CHUNK
    per_batch = BATCH_BYTES // CHUNK
    batches = [(start, min(start + per_batch, chunks)) for start in range(0, chunks, per_batch)]

    def compress_dev():
        return engine.encode_device_batches([(data[a * CHUNK : b * CHUNK], [[Region(CHUNK, kind)]] * (b - a))
                                             for a, b in batches])

    comp_s, encoded = timed(compress_dev)
    stored = HEADER * chunks + sum(len(p) for params, _, _ in encoded for p in params)
    stored += sum(int(out.size) for _, out, _ in encoded)
    tables = [[parse_params(params[i], CHUNK, offsets[i + 1] - offsets[i]) for i in range(len(params))]
              for params, _, offsets in encoded]

    def decompress_dev():
        return engine.decode_device_batches(
            [(out, offsets, table) for (_, out, offsets), table in zip(encoded, tables, strict=True)])

    decomp_s, decoded = timed(decompress_dev)
    assert all(cp.array_equal(part, data[a * CHUNK : b * CHUNK]) for part, (a, b) in zip(decoded, batches,
                                                                                             strict=True))
    host = data.get()
    items = [(host[i * CHUNK : (i + 1) * CHUNK].tobytes(), [Region(CHUNK, kind)]) for i in range(chunks)]

    def compress_host():
        return [e for a, b in batches for e in engine.encode_batch(items[a:b])]

    comp_host_s, host_encoded = timed(compress_host, repeat=1)

    def decompress_host():
        return [d for a, b in batches for d in engine.decode_batch([(e, CHUNK) for e in host_encoded[a:b]])]

    decomp_host_s, host_decoded = timed(decompress_host, repeat=1)
    assert all(bytes(d) == items[i][0] for i, d in enumerate(host_decoded))
    return Row(kind.name.lower(), label, size / stored, bound / stored, size / comp_s / 1e9,
               size / decomp_s / 1e9, size / comp_host_s / 1e9, size / decomp_host_s / 1e9)


def bench_nvcomp(data: cp.ndarray, algorithm: str, label: str, kind: ElementKind, bound: float,
                 **options) -> Row:
    """nvCOMP on the raw bytes, 128 KiB chunks, one batch."""
    codec = nvcomp.Codec(algorithm=algorithm, bitstream_kind=nvcomp.BitstreamKind.RAW,
                         uncomp_chunk_size=FRAME, **options)
    count = data.size // FRAME
    offsets, sizes = [i * FRAME for i in range(count)], [FRAME] * count
    capacity = codec.get_max_comp_buffer_size(nvcomp.as_array(data[:FRAME]))
    out = cp.empty(count * capacity, dtype=cp.uint8)
    sources = nvcomp.as_arrays(data, offsets, sizes)
    targets = nvcomp.as_arrays(out, [i * capacity for i in range(count)], [capacity] * count)
    comp_s, coded = timed(lambda: codec.encode(sources, out=targets))
    lengths = batch_sizes(coded)
    stored = sum(lengths)
    decoded = cp.empty_like(data)
    compressed = nvcomp.as_arrays(out, [i * capacity for i in range(count)], lengths)
    outputs = nvcomp.as_arrays(decoded, offsets, sizes)
    decomp_s, _ = timed(lambda: codec.decode(compressed, out=outputs))
    assert cp.array_equal(decoded, data)
    return Row(kind.name.lower(), label, data.size / stored, bound / stored, data.size / comp_s / 1e9,
               data.size / decomp_s / 1e9)


def bench_cpu(data: cp.ndarray, kind: ElementKind, bound: float) -> Row:
    host = data.get()
    chunks = [host[i * CHUNK : (i + 1) * CHUNK].tobytes() for i in range(data.size // CHUNK)]
    engine, threads = CpuEngine(), len(os.sched_getaffinity(0))
    with ThreadPoolExecutor(threads) as pool:
        start = time.perf_counter()
        encoded = list(pool.map(lambda chunk: engine.encode(chunk, [Region(CHUNK, kind)]), chunks))
        comp_s = time.perf_counter() - start
        start = time.perf_counter()
        decoded = list(pool.map(lambda e: engine.decode(e, CHUNK), encoded))
        decomp_s = time.perf_counter() - start
    assert all(bytes(d) == c for d, c in zip(decoded, chunks, strict=True))
    stored = sum(HEADER + len(e.params) + len(e.payload) for e in encoded)
    return Row(kind.name.lower(), f"nvfs cpu engine, {threads} threads", data.size / stored, bound / stored,
               comp_host=data.size / comp_s / 1e9, decomp_host=data.size / decomp_s / 1e9)


def fmt(value: float | None) -> str:
    return f"{value:8.1f}" if value is not None else f"{'-':>8}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.gpu_codec",
                                     description=__doc__.split("\n", 1)[0])
    parser.add_argument("--gib", type=float, default=1.0, help="GiB of data per dtype (default 1)")
    cli.add_json_arg(parser)
    args = parser.parse_args(argv)
    if GPU_MISSING is not None:
        parser.error(f"needs CuPy and nvCOMP (benchmarks/gpu_setup.sh install): {GPU_MISSING}")
    size = int(args.gib * (1 << 30)) // BATCH_BYTES * BATCH_BYTES
    machine = cli.print_header(None)
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, nvCOMP {nvcomp.__version__}, "
          f"cupy {cp.__version__}, torch {torch.__version__}, {len(os.sched_getaffinity(0))} CPU cores; "
          f"{size / 2**30:.2f} GiB per dtype in {CHUNK >> 20} MiB chunks", flush=True)
    zstd_engine, ans_engine = make_engine("gpu", 3), make_engine("gpu", 3, codec="ans")
    rows: list[Row] = []
    for seed, (kind, hint) in enumerate(((ElementKind.BF16, "<f2"), (ElementKind.FP32, "<f4"))):
        data = build(kind, size, seed)
        bound = plane_bound(data, kind)
        rows.append(bench_engine(zstd_engine, data, kind, "nvfs gpu portable", bound))
        rows.append(bench_engine(ans_engine, data, kind, "nvfs gpu ans", bound))
        rows.append(bench_nvcomp(data, "Zstd", "nvCOMP Zstd, raw bytes", kind, bound))
        rows.append(bench_nvcomp(data, "ANS", "nvCOMP ANS u1, raw bytes", kind, bound, data_type="|u1"))
        rows.append(bench_nvcomp(data, "ANS", f"nvCOMP ANS {hint}, raw bytes", kind, bound, data_type=hint))
        rows.append(bench_cpu(data, kind, bound))
        del data
        print(f"{kind.name.lower()} done", flush=True)
    header = (f"{'data':<5} {'method':<30} {'ratio':>7} {'of bnd':>7} {'comp dev':>8} {'dec dev':>8} "
              f"{'comp hst':>8} {'dec hst':>8}   (GB/s of logical bytes)")
    print(header)
    print("-" * len(header))
    for row in rows:
        print(f"{row.data:<5} {row.method:<30} {row.ratio:>6.3f}x {row.bound:>7.3f} {fmt(row.comp_dev)} "
              f"{fmt(row.decomp_dev)} {fmt(row.comp_host)} {fmt(row.decomp_host)}")
    checks = acceptance(rows)
    print()
    print_acceptance(checks, "acceptance (issue 4)")
    Result("gpu_codec", args, machine, rows=rows, acceptance=checks).write()
    return 0


def acceptance(rows: list[Row]) -> list[Check]:
    """The acceptance checks of issue 4."""
    checks = []
    for data in ("bf16", "fp32"):
        by = {row.method.split(",")[0]: row for row in rows if row.data == data}
        portable, ans, cpu = by["nvfs gpu portable"], by["nvfs gpu ans"], by["nvfs cpu engine"]
        checks += [
            Check(f"{data} portable compress {portable.comp_dev:.1f} GB/s >= 20", portable.comp_dev >= 20),
            Check(f"{data} portable decompress {portable.decomp_dev:.1f} GB/s >= 60",
                  portable.decomp_dev >= 60),
            Check(f"{data} portable ratio {portable.ratio:.3f}x within 2% of CPU engine {cpu.ratio:.3f}x",
                  portable.ratio >= 0.98 * cpu.ratio),
            Check(f"{data} ans compress {ans.comp_dev:.1f} and decompress {ans.decomp_dev:.1f} GB/s >= 200",
                  min(ans.comp_dev, ans.decomp_dev) >= 200),
            Check(f"{data} ans {ans.bound:.3f} of the bound >= 0.97", ans.bound >= 0.97),
        ]
    return checks


if __name__ == "__main__":
    sys.exit(main())
