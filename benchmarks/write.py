"""Time ``torch.save`` of a ~2 GiB mixed-precision checkpoint into nine targets, in one run.

Why this benchmark: nvfs must make a checkpoint save cheaper in bytes without making it slower,
and it is a Python FUSE filesystem, so the honest questions are (a) how it compares with a
mature compressing FUSE filesystem, JuiceFS, on the same disk, (b) how much of the ceiling of
the Python FUSE path itself (a filesystem that drops every byte) it reaches, and (c) whether
its memory stays within the bound its options promise. Targets, each in a fresh, empty place:

1. ``plain dir``: a directory on the same disk; ``torch.save`` then ``os.fsync`` (without the
   fsync the bytes may still sit in the page cache; every target's "durable s" includes
   whatever makes its data durable, so the comparison is fair).
2. ``null FUSE``: :mod:`benchmarks.harness.null_fs`, a pyfuse3 filesystem whose ``write``
   returns ``len(buf)`` and drops the bytes, with ``enable_writeback_cache = True``, the same
   pyfuse3 options as nvfs and nvfs's choice of ``direct_io`` (write-only handles that create or
   truncate their file bypass the page cache), run as its own process. It is the ceiling of the
   Python FUSE path on this machine: kernel -> pyfuse3 -> trio -> a handler, no work. ``null
   cached`` is the same with every handle in the page cache (nvfs with ``-o cached_writes``);
   the acceptance check takes the faster of the two.
3. ``JuiceFS``: ``juicefs format --storage file --bucket DIR/ --compress zstd sqlite3://META
   bench`` and ``juicefs mount -d``, otherwise with its defaults (only where its log and local
   cache go is moved into the benchmark's temp dir, and the usage report is off). Durable at
   ``close`` (no ``--writeback``). Stored bytes = the bucket directory after unmount.
4. ``nvfs dir``: nvfs on a backing directory, default options (plus ``--nvfs-options``).
   ``nvfs cached``: the same with ``-o cached_writes`` (the writer's pages go through the
   page cache, as they did before nvfs wrote write-only handles with ``direct_io``).
5. ``nvfs async``: the same with ``-o async_close``: close does not wait for the data to be
   stored; the file is then fsync'ed, which returns once it is durable.
6. ``nvfs S3``: nvfs on ``s3://bucket/store`` of a local SeaweedFS server this script starts
   (``nvfs/testing/seaweed.py``); stored bytes = sum of the bucket's object sizes (boto3 listing).
7. ``nvfs stage``: nvfs S3 with ``-o stage_dir=`` on the local disk: fsync returns once the
   data is durable in the stage; the unmount waits until the stage has drained to S3.

Timed: ``torch.save(state, path)`` including its ``close`` (FUSE flush), plus the ``fsync``
for the plain directory. "durable s" is the time until the data is on disk (or in S3): the
save + ``fsync`` for the plain directory and every nvfs target (nvfs commits a file after its
last close, and fsync waits for that commit; for ``nvfs stage``, durable in the local stage),
save + ``syncfs`` of the bucket directory's filesystem for JuiceFS (its file store does not
fsync blocks). Untimed afterwards:
unmount (its seconds are shown), stored bytes in the backing store, and a check of the data:
each FUSE store (JuiceFS, nvfs) is mounted again and the file read back through it must have
the SHA-256 of the plain ``torch.save`` bytes; the null filesystem must have received exactly
that many bytes.

Peak daemon RSS: VmRSS of the FUSE serving process, sampled every 0.2 s from
``/proc/PID/status`` in a thread, from mount until the process exits after unmount, with its
child processes' (nvfs's write processes, less the chunk buffers they share with the daemon);
VmHWM, the serving process's own, read just before unmount, is shown as well. For JuiceFS
that is the process serving FUSE (``Pid`` of its ``.config``); its supervisor process is
reported separately.

The checkpoint is built in memory, seeded, by :mod:`benchmarks.harness.checkpoint`: bf16 model
weights, fp32 master weights and AdamW ``exp_avg`` / ``exp_avg_sq`` from real AdamW steps,
with all-zero optimizer rows for embedding tokens never seen.

Run as root (FUSE), from the repository root::

    python3 -m benchmarks.write --quick                 # 256 MiB smoke run
    python3 -m benchmarks.write                         # 2 GiB, all nine targets
    python3 -m benchmarks.write --rounds 3              # each target 3 times (alternating order), medians
    python3 -m benchmarks.write --targets plain,nvfs-dir --nvfs-options max_inflight=512M

Exit status: 0 when every acceptance check passes (or cannot be made), 3 when one fails, 1 when a
target failed (error, hang, wrong data). Everything is unmounted, stopped and deleted at the end,
also after errors and SIGTERM (``--keep`` keeps the temp dir).
"""

from __future__ import annotations

import argparse
import io
import math
import shutil
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import cli
from benchmarks.harness.checkpoint import build_described, fit_shape
from benchmarks.harness.mounts import unmount_below
from benchmarks.harness.report import Check, Result, fmt, print_acceptance
from benchmarks.harness.rss import INTERVAL as RSS_INTERVAL
from benchmarks.harness.system import load_note, tool_version
from benchmarks.harness.units import MIB, human
from benchmarks.write_targets import BENCHES, LABELS, TARGETS, Context, Row, settle
from nvfs.options import parse_options

HEADROOM = 256 * MIB  # the RSS bound is max_inflight + this
PROBE_BYTES = 512 * MIB  # at most this much of the checkpoint goes through the engine probe
THROUGHPUT_VS_JUICEFS = 1.0
THROUGHPUT_VS_NULL = 0.6
STAGE_VS_PLAIN = 1.3  # torch.save into a staged mount returns within this multiple of the plain dir's time


def engine_probe(state: dict[str, Any], nvfs_options: str) -> str:
    """nvfs's codec engine alone on this checkpoint's bytes: no FUSE, no copies, no storage I/O.

    The torch.save bytes (in memory) are cut into chunks of the mount's chunk size; up to
    ``PROBE_BYTES`` of them, spread evenly over the file, are hashed and encoded as the store does
    (the new-store hash, BLAKE3, + ``encode_chunk``, the engine guessing the content instead of the layout
    tracker) on 1 and on 2 threads. Compared with the null filesystem it shows how much of the gap
    is compression CPU that any compressing filesystem pays on this machine.
    """
    from nvfs.codec import make_engine
    from nvfs.store.chunk import chunk_hash, encode_chunk
    from nvfs.store.superblock import NEW_STORE_HASH

    options = parse_options([nvfs_options] if nvfs_options else [])
    size = options.vfs.chunk_size
    buffer = io.BytesIO()
    torch.save(state, buffer)
    view = buffer.getbuffer()
    count = len(view) // size
    step = max(1, count * size // PROBE_BYTES)
    blocks = [bytes(view[i * size:(i + 1) * size]) for i in range(0, count, step)]
    del view, buffer
    engine = make_engine(options.engine, options.level)
    digest_of = chunk_hash(NEW_STORE_HASH)
    stored = 0

    def work(block: bytes) -> int:
        return sum(len(part) for part in encode_chunk(block, engine, None, digest_of(block))[0])

    rates = []
    for threads in (1, 2):
        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            stored = sum(pool.map(work, blocks))
        rates.append(len(blocks) * size / (time.perf_counter() - start) / 1e9)
    total = len(blocks) * size
    return (f"nvfs {engine.name} engine alone ({NEW_STORE_HASH} + encode_chunk, level {options.level}, "
            f"{len(blocks)} chunks of {human(size)} = {human(total)} spread over the file, ratio "
            f"{total / stored:.3f}x): {rates[0]:.3f} GB/s on 1 thread, {rates[1]:.3f} GB/s on 2 threads")


def print_table(rows: list[Row]) -> None:
    header = (f"{'target':<11} {'save s':>8} {'GB/s':>7} {'durable s':>9} {'logical bytes':>15} "
              f"{'stored bytes':>15} {'ratio':>7} {'peak RSS':>10} {'VmHWM':>10} {'umount s':>9}  "
              f"{'data':<12}")
    print(header)
    print("-" * len(header))
    for r in rows:
        if r.error and (r.skipped or math.isnan(r.seconds)):
            status = "not run" if r.skipped else "FAILED"
            print(f"{r.label:<11} {status}: {r.error}")
            continue
        stored = None if r.stored is None else f"{r.stored:,}"
        ratio = r.logical / r.stored if r.logical and r.stored else None
        rss = None if r.rss_peak is None else f"{r.rss_peak / MIB:.0f} MiB"
        hwm = None if r.rss_hwm is None else f"{r.rss_hwm / MIB:.0f} MiB"
        ratio_text = "n/a" if ratio is None else f"{ratio:.3f}x"
        print(f"{r.label:<11} {fmt(r.seconds, '.2f'):>8} {fmt(r.gbps, '.3f'):>7} "
              f"{fmt(r.durable_s, '.2f'):>9} {fmt(r.logical, ','):>15} {stored or 'n/a':>15} {ratio_text:>7} "
              f"{rss or 'n/a':>10} {hwm or 'n/a':>10} {fmt(r.umount_s, '.2f', '-'):>9}  {r.verified:<12}")
    print("(save s: torch.save incl. close, + fsync for the plain dir; durable s: until the data is on "
          "disk or in S3 (plain: = save s; JuiceFS: + syncfs of its bucket dir; nvfs: = save s, close is "
          "durable, on the local stage for nvfs stage; nvfs async: + fsync); GB/s = logical bytes / save s, "
          "1 GB = 1e9 B; stored: bytes in the backing store after unmount; peak RSS: VmRSS of the FUSE "
          f"daemon and its children sampled every {RSS_INTERVAL} s; VmHWM: read just before unmount; "
          "data: read-back check)")
    for r in rows:
        for note in r.notes:
            print(f"  {r.label}: {note}")
        if r.error and not (r.skipped or math.isnan(r.seconds)):
            print(f"  {r.label}: PROBLEM: {r.error}")


def acceptance(rows: dict[str, Row], max_inflight: int) -> list[Check]:
    """The acceptance checks; those that cannot be made here are n/a."""
    checks: list[Check] = []

    def usable(key: str) -> Row | None:
        r = rows.get(key)
        return r if r is not None and not r.error and not math.isnan(r.gbps) else None

    nv, jfs = usable("nvfs-dir"), usable("juicefs")
    null = max(filter(None, (usable("nullfs"), usable("nullfs-cached"))), key=lambda r: r.gbps, default=None)
    broken = rows.get("nvfs-dir") if rows.get("nvfs-dir") and rows["nvfs-dir"].error else None
    if broken:  # an nvfs failure fails the checks that need its numbers; it does not make them n/a
        checks.append(Check("nvfs dir ran correctly", False, broken.error or ""))
    name = "nvfs dir throughput >= 1.0x JuiceFS and stored bytes < JuiceFS's"
    if nv and jfs:
        speed = nv.gbps / jfs.gbps
        ok = speed >= THROUGHPUT_VS_JUICEFS and nv.stored is not None and jfs.stored is not None \
            and nv.stored < jfs.stored
        checks.append(Check(name, ok, f"{nv.gbps:.3f} vs {jfs.gbps:.3f} GB/s = {speed:.2f}x; stored "
                                      f"{nv.stored:,} vs {jfs.stored:,} B "
                                      f"({(nv.stored or 0) / (jfs.stored or 1):.3f}x)"))
    else:
        checks.append(Check(name, None, "needs both nvfs-dir and juicefs results"))
    name = f"nvfs dir throughput >= {THROUGHPUT_VS_NULL:.0%} of the null FUSE filesystem's"
    if nv and null:
        share = nv.gbps / null.gbps
        checks.append(Check(name, share >= THROUGHPUT_VS_NULL,
                            f"{nv.gbps:.3f} vs {null.gbps:.3f} GB/s ({null.label}, the faster null row) = "
                            f"{share:.1%}"))
    else:
        checks.append(Check(name, None, "needs nvfs-dir and a nullfs or nullfs-cached result"))
    plain, stage = usable("plain"), usable("nvfs-stage")
    name = f"nvfs stage torch.save returns in <= {STAGE_VS_PLAIN}x the plain dir's time (torch.save + fsync)"
    if plain and stage:
        factor = stage.seconds / plain.seconds
        checks.append(Check(name, factor <= STAGE_VS_PLAIN,
                            f"{stage.seconds:.2f} vs {plain.seconds:.2f} s = {factor:.2f}x; in S3 after "
                            f"{stage.seconds + stage.umount_s:.2f} s"))
    else:
        checks.append(Check(name, None, "needs both plain and nvfs-stage results"))
    bound = max_inflight + HEADROOM
    for key in ("nvfs-dir", "nvfs-cached", "nvfs-async", "nvfs-s3", "nvfs-stage"):
        r = rows.get(key)
        name = f"{LABELS[key]} peak RSS <= max_inflight + 256 MiB = {human(bound)}"
        if r is None or r.rss_peak is None:
            checks.append(Check(name, None, "not measured"))
            continue
        hwm = "" if r.rss_hwm is None else f"; VmHWM {human(r.rss_hwm)}" + (
            " (also above the bound)" if r.rss_hwm > bound else "")
        checks.append(Check(name, r.rss_peak <= bound, f"sampled peak {human(r.rss_peak)}{hwm}"))
    return checks


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.write",
                                     description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size-mib", type=int, default=None, help="training state size (default 2048)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 256 MiB state")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"comma list, any of {','.join(TARGETS)} (default: all)")
    parser.add_argument("--nvfs-options", default="", help="extra nvfs -o options, e.g. max_inflight=512M")
    parser.add_argument("--adam-steps", type=int, default=3, help="AdamW steps to build optimizer state")
    parser.add_argument("--save-timeout", type=float, default=900.0,
                        help="seconds after which a torch.save into a FUSE target counts as hung "
                             "(default 900)")
    parser.add_argument("--no-verify", action="store_true", help="skip the read-back checks")
    parser.add_argument("--no-probe", action="store_true", help="skip the nvfs engine-only diagnostic")
    parser.add_argument("--no-torch-crc32", action="store_true",
                        help="torch.save without the CRC-32 of each record it writes "
                             "(torch.utils.serialization.config.save.compute_crc32 = False)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="save into every target this many times, in alternating order, and report "
                             "each target's median round (default 1)")
    cli.add_common_args(parser)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.size_mib is None:
        args.size_mib = 256 if args.quick else 2048
    wanted = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = sorted(set(wanted) - set(TARGETS))
    if unknown or not wanted:
        parser.error(f"--targets: unknown {', '.join(unknown) or '(empty)'}; "
                     f"choose from {', '.join(TARGETS)}")
    args.targets = [t for t in TARGETS if t in wanted]
    return args


def run_target(ctx: Context, key: str, round_index: int) -> Row:
    """One save into one target, in a fresh place that is removed afterwards."""
    row = Row(key)
    settle()
    row.notes.append(load_note() + f" (before the save, round {round_index + 1})")
    print(f"[{row.label}] round {round_index + 1} ...", flush=True)
    began = time.perf_counter()
    try:
        BENCHES[key](ctx, row)
    except Exception as exc:
        row.error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    finally:
        if not unmount_below(ctx.work / key) and not ctx.args.keep:
            shutil.rmtree(ctx.work / key, ignore_errors=True)
    status = ("not run: " + (row.error or "")) if row.skipped else \
        (f"FAILED: {row.error}" if row.error else
         f"{row.seconds:.2f} s, {row.gbps:.3f} GB/s, stored {fmt(row.stored, ',')}, "
         f"peak RSS {human(row.rss_peak) if row.rss_peak else 'n/a'}, data {row.verified}")
    print(f"[{row.label}] {status} ({time.perf_counter() - began:.0f} s with mount, unmount and check)",
          flush=True)
    return row


def representative(results: list[Row]) -> Row:
    """A target's row over its rounds: a failed round if any (a failure is never averaged
    away), else the median round by save time, with the highest memory peak of all rounds."""
    failed = [r for r in results if r.error]
    if failed:
        return failed[0]
    chosen = sorted(results, key=lambda r: r.seconds)[len(results) // 2]
    peaks = [r.rss_peak for r in results if r.rss_peak is not None]
    hwms = [r.rss_hwm for r in results if r.rss_hwm is not None]
    return replace(chosen, rss_peak=max(peaks) if peaks else None, rss_hwm=max(hwms) if hwms else None,
                   notes=[note for r in results for note in r.notes])


def run(args: argparse.Namespace, work: Path, result: Result) -> int:
    started = time.perf_counter()
    max_inflight = parse_options([args.nvfs_options] if args.nvfs_options else []).vfs.max_inflight
    inflight_source = ("set with -o max_inflight" if "max_inflight" in args.nvfs_options
                       else "nvfs default, no -o max_inflight passed")
    print(f"nvfs options: {args.nvfs_options or '(defaults)'}; targets: {', '.join(args.targets)}")
    state = build_described(fit_shape(args.size_mib * MIB), args.seed, args.adam_steps)
    ctx = Context(args, work, state, nvfs_options=args.nvfs_options)
    runs: dict[str, list[Row]] = {key: [] for key in args.targets}
    for round_index in range(args.rounds):
        # Alternate the order, so that a drift of the machine's speed favours no target.
        order = args.targets if round_index % 2 == 0 else args.targets[::-1]
        for key in order:
            runs[key].append(run_target(ctx, key, round_index))
    rows = {key: representative(results) for key, results in runs.items()}
    if args.rounds > 1:
        print("\nsave s per round (the table shows each target's median round; peak RSS: the highest):")
        for key, results in runs.items():
            print(f"  {LABELS[key]:<11} " + ", ".join(fmt(r.seconds, ".2f") for r in results))

    print()
    print_table(list(rows.values()))
    if not args.no_probe and {"nvfs-dir", "nvfs-s3"} & set(args.targets):
        try:
            print(f"diagnostic: {engine_probe(state, args.nvfs_options)}")
        except Exception as exc:  # a diagnostic only: never lose the table over it
            print(f"diagnostic: engine probe failed: {type(exc).__name__}: {exc}")
    print()
    checks = acceptance(rows, max_inflight)
    passed = print_acceptance(checks, f"acceptance (max_inflight = {human(max_inflight)}, {inflight_source})")
    print(f"\ntotal runtime {time.perf_counter() - started:.1f} s")
    result.rows, result.acceptance = list(rows.values()), checks
    result.trials = {key: [r.seconds for r in results] for key, results in runs.items()}
    result.write()
    failed = [r.label for r in rows.values() if r.error and not r.skipped]
    if failed:
        print(f"targets that failed: {', '.join(failed)}")
    return 1 if failed else (0 if passed else 3)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.no_torch_crc32:
        from torch.utils.serialization import config as torch_serialization
        torch_serialization.save.compute_crc32 = False
    with cli.workdir(args, "write") as work:
        tools = f"juicefs {tool_version('juicefs', '--version')}; weed {tool_version('weed', 'version')}"
        crc = "torch.save computes no CRC-32 of its records (--no-torch-crc32)"
        machine = cli.print_header(work, f"tools: {tools}", *([crc] if args.no_torch_crc32 else []))
        return run(args, work, Result("write", args, machine))


if __name__ == "__main__":
    sys.exit(main())
