"""Part 1 of the S3 read scenario: a cold restore of a checkpoint through nvfs and without it.

Also ``--compare``: the same cold ``cat`` under several sets of mount options, side by side.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from boto3.s3.transfer import TransferConfig

from benchmarks.harness.checkpoint import build_described, fit_shape, verify
from benchmarks.harness.files import drop_caches, fsync_path, sha256_file, timed_cat
from benchmarks.harness.mounts import XATTR, NvfsMount
from benchmarks.harness.report import Check
from benchmarks.harness.units import MIB, human
from benchmarks.s3_read.cold_reads import (
    BUCKET_PLAIN,
    CpuMeter,
    Trial,
    cold_cat,
    cold_get_object,
    median_trial,
    plain_client,
    s3_mount,
    trials_note,
)
from benchmarks.s3_read.table import Results, Row
from nvfs.testing.seaweed import SeaweedServer

_LOADER = ("import sys, time, torch; start = time.perf_counter(); "
           "torch.load(sys.argv[1], map_location='cpu', weights_only=True); "
           "print(time.perf_counter() - start)")


def timed_torch_load(path: Path) -> float:
    """Seconds ``torch.load(path)`` takes in a new process, as in a job that restores a checkpoint.

    Timed inside that process, after ``import torch``. A new process matters: on a 16-core
    host a 2 GiB cached copy loaded in 0.69-0.74 s in this script's own process, which had held
    that much memory before, and in 1.2-1.6 s in new processes (from tmpfs).
    """
    result = subprocess.run([sys.executable, "-c", _LOADER, str(path)], check=True,
                            capture_output=True, text=True)
    return float(result.stdout)


# The same restore without nvfs: stream the object into memory (as row 1c's fastest download
# does), then torch.load it. The client is made before the clock starts.
_PLAIN_RESTORE = ("import io, sys, time, boto3, torch; from botocore.config import Config; "
                  "client = boto3.client('s3', config=Config(s3={'addressing_style': 'path'})); "
                  "start = time.perf_counter(); buffer = io.BytesIO(); "
                  "body = client.get_object(Bucket=sys.argv[1], Key=sys.argv[2])['Body']; "
                  "[buffer.write(block) for block in body.iter_chunks(1 << 20)]; buffer.seek(0); "
                  "torch.load(buffer, map_location='cpu', weights_only=True); "
                  "print(time.perf_counter() - start)")


def timed_plain_restore(server: SeaweedServer, bucket: str, key: str) -> float:
    """Seconds a new process takes to get_object ``key`` into memory and ``torch.load`` it."""
    result = subprocess.run([sys.executable, "-c", _PLAIN_RESTORE, bucket, key], check=True,
                            capture_output=True, text=True, env={**os.environ, **server.environ()})
    return float(result.stdout)


class NullSink:
    """A write-only file object that drops what it gets (for ``download_fileobj``)."""

    def __init__(self) -> None:
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self.bytes += len(data)
        return len(data)




@dataclass
class SavedCheckpoint:
    """Part 1's checkpoint: the state, saved as a plain object and through an nvfs mount."""

    state: dict[str, Any]
    size: int
    digest: str
    stored: int
    client: Any
    mount: NvfsMount
    path: Path


def save_checkpoint(args: argparse.Namespace, server: SeaweedServer, work: Path, results: Results,
                    options: str) -> SavedCheckpoint:
    """Build the state, upload its torch.save bytes as one object, save it through nvfs, unmount."""
    state = build_described(fit_shape(args.size_mib * MIB), args.seed, args.adam_steps)

    # The plain object: the same torch.save bytes, uploaded as one object.
    local = work / "local" / "ckpt.pt"
    local.parent.mkdir()
    torch.save(state, local)
    size = local.stat().st_size
    digest = sha256_file(local)
    client = plain_client(server)
    start = time.perf_counter()
    client.upload_file(str(local), BUCKET_PLAIN, "ckpt.pt")
    upload_s = time.perf_counter() - start
    local.unlink()
    results.add(Row("1", "setup: boto3 upload_file of the plain object", upload_s, size,
                    detail="default TransferConfig (multipart)"))

    mount = s3_mount(server, "ckpt", work, "ckpt", options)
    mount.mount()
    path = mount.mnt / "ckpt.pt"
    start = time.perf_counter()
    torch.save(state, path)
    fsync_path(path)  # the commit follows close(2); fsync waits for it: durable in S3 from here
    save_s = time.perf_counter() - start
    if path.stat().st_size != size:
        raise AssertionError(f"torch.save wrote {path.stat().st_size} bytes through nvfs, {size} locally")
    stored = int(os.getxattr(path, XATTR + "stored_size"))
    committed = os.getxattr(path, XATTR + "committed").decode()
    umount_s = mount.umount()
    results.add(Row("1", "setup: nvfs torch.save through the mount", save_s, size,
                    detail=f"stored {human(stored)}, ratio {size / stored:.3f}x, committed after fsync: "
                           f"{committed}, umount {umount_s:.2f} s"))
    return SavedCheckpoint(state, size, digest, stored, client, mount, path)


def cold_rounds(saved: SavedCheckpoint, server: SeaweedServer, variants: list[str],
                rounds: int) -> dict[str, list[tuple[Trial, Trial]]]:
    """Per variant (extra mount options), ``rounds`` pairs of a cold ``cat`` and the ``get_object`` after it.

    Each round runs every variant once, in the same order, so that every variant sees the same
    drift of a shared host, and the plain download right after each cat sees it too.
    """
    pairs: dict[str, list[tuple[Trial, Trial]]] = {variant: [] for variant in variants}
    try:
        for _ in range(rounds):
            for variant in variants:
                cat = cold_cat(saved.mount, saved.path, server, variant)
                saved.mount.umount()
                get = cold_get_object(saved.client, server, saved.size)
                pairs[variant].append((cat, get))
                print(f"    -o {variant or '(the mount options)'}: cat {cat[0]:.2f} s, "
                      f"get_object {get[0]:.2f} s, {get[0] / cat[0]:.2f}x", flush=True)
    finally:
        saved.mount.close()
    return pairs


def compare_options(args: argparse.Namespace, server: SeaweedServer, work: Path, results: Results,
                    options: str) -> None:
    """Cold ``cat`` with the mount options and with each ``--compare`` variant (:func:`cold_rounds`).

    A variant's row gives its median cat and, as "x plain", its median ratio to the
    ``get_object`` right after each cat.
    """
    saved = save_checkpoint(args, server, work, results, options)
    for variant, pairs in cold_rounds(saved, server, ["", *args.compare], args.trials).items():
        cats = [cat for cat, _ in pairs]
        ratios = [get[0] / cat[0] for cat, get in pairs]
        cat_s, cat_detail = median_trial(cats)
        row = results.add(Row("1a", f"cat, -o {variant or '(the mount options)'}", cat_s, saved.size,
                              detail=f"{trials_note(cats)}; {cat_detail}; x get_object right after: "
                                     f"{', '.join(f'{r:.2f}' for r in ratios)}"))
        row.vs_plain = sorted(ratios)[(len(ratios) - 1) // 2]


def part1(args: argparse.Namespace, server: SeaweedServer, work: Path, results: Results,
          options: str) -> None:
    saved = save_checkpoint(args, server, work, results, options)
    state, size, digest, stored, client, mount, path = (saved.state, saved.size, saved.digest, saved.stored,
                                                        saved.client, saved.mount, saved.path)
    # (a) cat, cold, alternating with (c)'s get_object: the host's speed drifts between runs.
    pairs = cold_rounds(saved, server, [""], args.trials)[""]
    cat_trials = [cat for cat, _ in pairs]
    get_trials = [get for _, get in pairs]
    try:
        cat_s, cat_detail = median_trial(cat_trials)
        cat = results.add(Row("1a", "nvfs cold: cat FILE > /dev/null", cat_s, size,
                              detail=f"{trials_note(cat_trials)}; {cat_detail}"))

        # (b) torch.load, cold.
        pid = mount.mount()
        drop_caches()
        meter = CpuMeter(pid, server)
        load_s = timed_torch_load(path)
        load_detail = meter.note()
        loaded = torch.load(path, map_location="cpu", weights_only=True)  # untimed checks
        verify(state, loaded)
        del loaded
        gc.collect()
        if sha256_file(path) != digest:  # (a)'s cats read what torch.save wrote
            raise AssertionError("the file read through nvfs differs from the uploaded torch.save bytes")
        load = results.add(Row("1b", "nvfs cold: torch.load(FILE), new process", load_s, size,
                               detail=load_detail + "; all tensors bit-exact, the file's sha256 matches"))

        # (d) cat with every chunk in a local disk cache: the daemon's read path without
        # SeaweedFS sharing the CPUs (how fast nvfs reads when the store is not the limit).
        (work / "chunk-cache").mkdir()
        cache = f"cache_dir={work / 'chunk-cache'}"
        mount.remount(cache)
        timed_cat(path)  # fills the cache
        pid = mount.remount(cache)
        drop_caches()
        meter = CpuMeter(pid, server)
        warm_s = timed_cat(path)
        results.add(Row("1d", "nvfs warm disk cache: cat FILE > /dev/null", warm_s, size,
                        detail=f"{meter.note()}; chunks from -o cache_dir, page cache dropped"))
    finally:
        mount.close()
    del state, saved
    gc.collect()

    # (c) plain boto3, cold: get_object timed in (a)'s trials.
    get_s, get_detail = median_trial(get_trials)
    plain: list[Row] = [results.add(Row("1c", "plain boto3: get_object streamed, 1 connection", get_s, size,
                                        detail=f"{trials_note(get_trials)}; {get_detail}"))]

    target = work / "download" / "ckpt.pt"
    target.parent.mkdir()
    drop_caches()
    start = time.perf_counter()
    client.download_file(BUCKET_PLAIN, "ckpt.pt", str(target), Config=TransferConfig())
    dl_s = time.perf_counter() - start
    if target.stat().st_size != size:
        raise AssertionError(f"download_file wrote {target.stat().st_size} bytes, expected {size}")
    target.unlink()
    plain.append(results.add(Row("1c", "plain boto3: download_file -> local file", dl_s, size,
                                 detail="default TransferConfig: 8 MiB parts, 10 threads; no fsync")))

    drop_caches()
    sink = NullSink()
    start = time.perf_counter()
    client.download_fileobj(BUCKET_PLAIN, "ckpt.pt", sink, Config=TransferConfig())
    sink_s = time.perf_counter() - start
    if sink.bytes != size:
        raise AssertionError(f"download_fileobj delivered {sink.bytes} bytes, expected {size}")
    plain.append(results.add(Row("1c", "plain boto3: download_fileobj -> null sink", sink_s, size,
                                 detail="default TransferConfig: 8 MiB parts, 10 threads")))

    # (f) the restore nvfs replaces: download, then torch.load. What torch.load is judged by.
    drop_caches()
    plain_restore = results.add(Row("1f", "plain boto3: get_object + torch.load, new proc",
                                    timed_plain_restore(server, BUCKET_PLAIN, "ckpt.pt"), size,
                                    detail="get_object streamed as in 1c into a BytesIO, then torch.load"))

    # (e) torch.load with the file in the page cache: the loader's own speed, no FUSE, no S3.
    client.download_file(BUCKET_PLAIN, "ckpt.pt", str(target), Config=TransferConfig())
    timed_cat(target)  # every page cached
    memory_load = results.add(Row("1e", "torch.load(FILE) page-cached copy, new process",
                                  timed_torch_load(target), size,
                                  detail="a local copy read once before: no FUSE, no S3"))
    target.unlink()

    best = max(plain, key=lambda r: r.gbps or 0.0)
    for row in (cat, load):
        assert row.gbps is not None and best.gbps is not None
        row.vs_plain = row.gbps / best.gbps
    results.notes.append(f"part 1 best plain download: {best.what} ({best.gbps:.3f} GB/s); "
                         f"file {size:,} B logical, {stored:,} B stored")
    assert cat.gbps is not None and best.gbps is not None
    get_gbps = plain[0].gbps or math.nan
    results.acceptance.append(Check(
        "nvfs cold cat GB/s >= 1.0x plain download",
        cat.gbps >= best.gbps,
        f"{cat.gbps:.3f} GB/s = {cat.gbps / best.gbps:.2f}x best plain ({best.what}, {best.gbps:.3f} GB/s); "
        f"{cat.gbps / get_gbps:.2f}x get_object"))
    assert load.gbps is not None and memory_load.gbps is not None and plain_restore.gbps is not None
    results.acceptance.append(Check(
        "nvfs cold torch.load GB/s >= 1.0x plain download + torch.load",
        load.gbps >= plain_restore.gbps,
        f"{load.gbps:.3f} GB/s = {load.gbps / plain_restore.gbps:.2f}x plain get_object + torch.load "
        f"({plain_restore.gbps:.3f} GB/s); vs the download alone {load.gbps / best.gbps:.2f}x best plain, "
        f"where torch.load of a page-cached copy reaches {memory_load.gbps / best.gbps:.2f}x"))
