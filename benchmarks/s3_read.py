"""Cold reads from S3 through nvfs vs plain boto3, lazy safetensors reads, and the daemon's memory bound.

Everything runs against one local SeaweedFS S3 server that this script starts
(``tests/seaweed.py``), in one run, and ends in one table plus an acceptance section:

1. **Cold sequential read of a >= 2 GiB checkpoint.** A seeded mixed-precision training state
   (bf16 weights, fp32 master weights, AdamW moments: the builder of ``benchmarks/save.py``) is
   ``torch.save``d *through* an nvfs S3 mount. nvfs is unmounted and mounted again (its chunk
   cache is empty) and the kernel's caches are dropped (``echo 3 > /proc/sys/vm/drop_caches``,
   which also drops SeaweedFS's volume files) before each cold read:

   a. ``cat FILE > /dev/null`` through the mount, ``--trials`` times (3), each time on a fresh
      mount and followed by (c)'s ``get_object``, so that both see the same drift of a shared
      host; each row shows the median trial and lists them all;
   b. ``torch.load(FILE)`` through the mount in a new process, as a restoring job would (then
      loaded again, untimed, and checked tensor by tensor against the state);
   c. plain boto3 on the same uncompressed bytes, uploaded as one ordinary object to the same
      server: ``get_object`` streamed to nowhere (one connection), ``download_file`` with boto3's
      default ``TransferConfig`` to a local file (ranged GETs on 10 threads; the file is not
      fsynced) and ``download_fileobj`` with the default config into a sink that drops the bytes;
   d. ``cat FILE`` again, every chunk from a warm ``-o cache_dir`` (page cache dropped): the
      daemon's own read path, without SeaweedFS competing for the CPUs (no acceptance target);
   e. ``torch.load`` of a local copy that is in the page cache, in a new process: the loader's
      own speed, the most any filesystem could give it (no acceptance target; shown next to
      torch.load's check);
   f. the restore without nvfs, in a new process: ``get_object`` streamed into memory, then
      ``torch.load`` of it. ``torch.load`` through the mount is judged against this, the plain
      download that ends in tensors; ``cat`` against the best download of (c).

   nvfs's speed is given as a multiple of the best plain download. The file read through the
   mount is also hashed (untimed) and compared with the bytes that were uploaded.

2. **``safe_open`` of one tensor** of a 1 GiB safetensors file (64 tensors of 16 MiB, bf16 and
   fp32, written through the mount with ``save_file``) after a remount and a cache drop: how many
   bytes nvfs fetched from S3 for it, against the file's stored size (``user.nvfs.stored_size``).
   Measured outside nvfs: the measuring mount's ``endpoint_url`` is a TCP relay in this script
   that counts every byte SeaweedFS sends the daemon (response headers, listings and manifests
   included: an upper bound) and notes every request's method and path; the chunk GETs are
   priced with the stored sizes from the file's manifest. Counting stops once no traffic has
   passed for 1 s, so read-ahead the access started is included. (The daemon log cannot be used:
   nvfs keeps boto3/urllib3 quiet even at ``log_level=debug``; nor can ``rchar`` in
   ``/proc/PID/io``, which does not count Python's recv(2) calls.) Also shown: the least nvfs
   could have fetched, the stored size of the chunks the header and that tensor overlap.
   ``get_tensor`` maps the file lazily, so the timed part includes a ``clone()`` that touches
   every page of the tensor.

3. **Peak daemon RSS** while writing ``--rss-mib`` (8 GiB) through a fresh mount in 4 MiB
   ``write`` calls of semi-compressible data (normal floats rounded to bf16 precision, every 4 MiB
   block distinct so nothing dedups), then reading it back with ``cat``. VmRSS is sampled every
   0.2 s from ``/proc/PID/status`` in a thread, VmHWM is read at the end, each summed over the
   daemon and its fetch processes (``-o fetch_procs``: a chunk is in one process's memory at a
   time, the child's while it decodes, the daemon's once cached); the bound is
   ``cache_size + max_inflight + 256 MiB`` of the options the mounts use.

``--compare OPTIONS`` (repeatable) replaces part 1 with a comparison of mount options: the
checkpoint is saved as above, then each round runs a cold ``cat`` with the mount options and
with each variant's extra options, in turn, each followed by a cold ``get_object``; a row per
variant gives its median and the ratios to the ``get_object`` right after each cat.

Run as root (FUSE, drop_caches)::

    python3 benchmarks/s3_read.py --quick      # smoke run, small sizes
    python3 benchmarks/s3_read.py              # 2 GiB checkpoint, 1 GiB safetensors, 8 GiB RSS run
    python3 benchmarks/s3_read.py --parts 1 --compare readahead=128M,threads=32   # options side by side
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import multiprocessing
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import boto3  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from boto3.s3.transfer import TransferConfig  # noqa: E402
from botocore.config import Config  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from benchmarks.common import (  # noqa: E402
    MIB,
    NVFS,
    XATTR,
    cpu_seconds,
    drop_caches,
    fsync_path,
    human,
    make_workdir,
    proc_status,
    raise_on_sigterm,
    sha256_file,
    timed_cat,
    tree_cpu_seconds,
    tree_status,
)
from benchmarks.save import (  # noqa: E402
    build_state,
    fit_shape,
    machine_info,
    tensors,
    verify,
    zero_row_fraction,
)
from nvfs.options import parse_options  # noqa: E402
from nvfs.testing.seaweed import REGION, SeaweedServer  # noqa: E402

HEADROOM = 256 * MIB  # the RSS bound is cache_size + max_inflight + this
SAFETENSORS_TENSORS = 64
BLOCK = 4 * MIB  # write size of the RSS run
RSS_INTERVAL = 0.2
FETCH_TARGET = 0.05  # safe_open of one tensor may fetch less than this share of the stored bytes
BUCKET_NVFS = "nvfs"
BUCKET_PLAIN = "plain"


# ----- small helpers ----------------------------------------------------------------------------

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


class CpuMeter:
    """CPU seconds the daemon (with its fetch processes) and SeaweedFS spend from now on."""

    def __init__(self, pid: int, server: SeaweedServer) -> None:
        self.pid, self.server = pid, server
        self.daemon, self.weed = tree_cpu_seconds(pid), cpu_seconds(server.pid)

    def note(self) -> str:
        return (f"daemon CPU {tree_cpu_seconds(self.pid) - self.daemon:.1f} s, weed CPU "
                f"{cpu_seconds(self.server.pid) - self.weed:.1f} s")


Trial = tuple[float, str]  # seconds, and what else was measured meanwhile


def cold_cat(mount: NvfsMount, path: Path, server: SeaweedServer, extra: str = "") -> Trial:
    """``cat`` on a fresh mount with ``extra`` options, page cache dropped: (seconds, CPU and memory).

    It stays mounted.
    """
    pid = mount.mount(extra)
    drop_caches()
    meter = CpuMeter(pid, server)
    seconds = timed_cat(path)
    return seconds, f"{meter.note()}, daemon VmHWM {human(tree_status(pid, 'VmHWM'))}"


def cold_get_object(client: Any, server: SeaweedServer, size: int) -> Trial:
    """The plain object streamed by one ``get_object``, page cache dropped: (seconds, weed CPU)."""
    drop_caches()
    weed0 = cpu_seconds(server.pid)
    start = time.perf_counter()
    body = client.get_object(Bucket=BUCKET_PLAIN, Key="ckpt.pt")["Body"]
    got = sum(len(block) for block in body.iter_chunks(MIB))
    seconds = time.perf_counter() - start
    if got != size:
        raise AssertionError(f"get_object returned {got} bytes, expected {size}")
    return seconds, f"weed CPU {cpu_seconds(server.pid) - weed0:.1f} s"


def median_trial(trials: list[Trial]) -> Trial:
    """The trial of median time (the lower middle one of an even count) and its detail."""
    return sorted(trials)[(len(trials) - 1) // 2]


def trials_note(trials: list[Trial]) -> str:
    """How a median row was made, with every trial's seconds in the order they ran."""
    if len(trials) == 1:
        return "1 trial"
    return f"median of {len(trials)} trials ({', '.join(f'{seconds:.2f}' for seconds, _ in trials)} s)"


def other_load(mine: int | None = None) -> str:
    """Load average, and weed / nvfs processes this run did not start (they skew 2-core numbers)."""
    skip = {os.getpid(), mine}
    weeds = daemons = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"weed":
            weeds += 1
        elif b"nvfs" in argv[:3] and b"mount" in argv[:4]:
            daemons += 1
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return f"loadavg {load}; other processes running: {weeds} weed, {daemons} nvfs daemons"


def ranges(indices: Any) -> str:
    """``0-1,32-53``: sorted distinct integers as ranges."""
    spans: list[list[int]] = []
    for i in sorted(set(indices)):
        if spans and spans[-1][1] == i - 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans) or "none"


# ----- nvfs mounts -------------------------------------------------------------------------------

class NvfsMount:
    """One nvfs daemon on ``s3://bucket/prefix`` at ``mountpoint``, mounted and unmounted on demand."""

    def __init__(self, server: SeaweedServer, url: str, mountpoint: Path, log_file: Path,
                 options: str) -> None:
        self.server = server
        self.url = url
        self.mountpoint = mountpoint
        self.log_file = log_file
        self.options = options
        self.pid: int | None = None
        mountpoint.mkdir(parents=True, exist_ok=True)

    def _nvfs(self, *args: str, timeout: float) -> None:
        env = {**os.environ, **self.server.environ()}
        result = subprocess.run([*NVFS, *args], capture_output=True, text=True, timeout=timeout, env=env)
        if result.returncode != 0:
            raise RuntimeError(f"nvfs {' '.join(args)} failed ({result.returncode}): "
                               f"{result.stderr.strip()}")

    def mount(self, extra: str = "", endpoint_url: str | None = None) -> int:
        endpoint_url = endpoint_url or self.server.endpoint_url
        options = ",".join(filter(None, (f"endpoint_url={endpoint_url}",
                                         f"log_file={self.log_file}", self.options, extra)))
        self._nvfs("mount", self.url, str(self.mountpoint), "-o", options, timeout=120)
        self.pid = int(os.getxattr(self.mountpoint, XATTR + "pid"))
        return self.pid

    def umount(self) -> float:
        """Unmount and wait for the daemon to exit; returns the seconds that took."""
        start = time.perf_counter()
        self._nvfs("umount", str(self.mountpoint), timeout=900)
        self.pid = None
        return time.perf_counter() - start

    def remount(self, extra: str = "") -> int:
        self.umount()
        return self.mount(extra)

    def close(self) -> None:
        """Unmount if mounted; if a clean unmount fails, unmount lazily and stop our daemon."""
        if not os.path.ismount(self.mountpoint):
            return
        try:
            self.umount()
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"warning: {exc}; lazy unmount", file=sys.stderr)
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], check=False)
            pid, self.pid = self.pid, None
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)



# ----- the table -----------------------------------------------------------------------------------

@dataclass
class Row:
    part: str
    what: str
    seconds: float
    logical: int | None = None  # bytes, for GB/s
    vs_plain: float | None = None  # GB/s as a multiple of the best plain download
    detail: str = ""

    @property
    def gbps(self) -> float | None:
        if self.logical is None or not self.seconds or math.isnan(self.seconds):
            return None
        return self.logical / self.seconds / 1e9


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    acceptance: list[tuple[str, bool, str]] = field(default_factory=list)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        gbps = f", {row.gbps:.3f} GB/s" if row.gbps is not None else ""
        secs = "" if math.isnan(row.seconds) else f": {row.seconds:.2f} s"
        print(f"  [{row.part}] {row.what}{secs}{gbps}  {row.detail}", flush=True)
        return row


def print_table(results: Results) -> None:
    header = f"{'part':<4} {'measurement':<48} {'seconds':>8} {'GB/s':>7} {'x plain':>8}  detail"
    print(header)
    print("-" * 130)
    for r in results.rows:
        gbps = f"{r.gbps:.3f}" if r.gbps is not None else "-"
        vs = f"{r.vs_plain:.2f}x" if r.vs_plain is not None else "-"
        secs = "-" if math.isnan(r.seconds) else f"{r.seconds:.2f}"
        print(f"{r.part:<4} {r.what:<48} {secs:>8} {gbps:>7} {vs:>8}  {r.detail}")
    print("(GB/s: logical bytes / seconds, 1 GB = 1e9 B; x plain: nvfs GB/s / best plain boto3 GB/s; "
          "daemon CPU and VmHWM: the nvfs daemon with its fetch processes)")
    for note in results.notes:
        print(f"  {note}")


# ----- part 1: cold sequential read ------------------------------------------------------------------

class NullSink:
    """A write-only file object that drops what it gets (for ``download_fileobj``)."""

    def __init__(self) -> None:
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self.bytes += len(data)
        return len(data)


def plain_client(server: SeaweedServer) -> Any:
    """A boto3 S3 client with boto3's defaults (10 pooled connections, default timeouts)."""
    env = server.environ()
    return boto3.client("s3", endpoint_url=server.endpoint_url, region_name=REGION,
                        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                        config=Config(s3={"addressing_style": "path"}))


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
    started = time.perf_counter()
    shape = fit_shape(args.size_mib * MIB)
    state = build_state(shape, args.seed, args.adam_steps)
    count = len(list(tensors(state)))
    print(f"[1] state: {human(sum(t.numel() * t.element_size() for _, t in tensors(state)))} in {count} "
          f"tensors; hidden {shape.hidden}, {shape.layers} layers, vocab {shape.vocab}, "
          f"{args.adam_steps} AdamW steps, {zero_row_fraction(state):.1%} embedding rows with all-zero "
          f"Adam state; built in {time.perf_counter() - started:.1f} s", flush=True)

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

    mount = NvfsMount(server, f"s3://{BUCKET_NVFS}/ckpt", work / "mnt-ckpt", work / "nvfs-ckpt.log", options)
    mount.mount()
    path = mount.mountpoint / "ckpt.pt"
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
    results.acceptance.append((
        "nvfs cold cat GB/s >= 1.0x plain download",
        cat.gbps >= best.gbps,
        f"{cat.gbps:.3f} GB/s = {cat.gbps / best.gbps:.2f}x best plain ({best.what}, {best.gbps:.3f} GB/s); "
        f"{cat.gbps / get_gbps:.2f}x get_object"))
    assert load.gbps is not None and memory_load.gbps is not None and plain_restore.gbps is not None
    results.acceptance.append((
        "nvfs cold torch.load GB/s >= 1.0x plain download + torch.load",
        load.gbps >= plain_restore.gbps,
        f"{load.gbps:.3f} GB/s = {load.gbps / plain_restore.gbps:.2f}x plain get_object + torch.load "
        f"({plain_restore.gbps:.3f} GB/s); vs the download alone {load.gbps / best.gbps:.2f}x best plain, "
        f"where torch.load of a page-cached copy reaches {memory_load.gbps / best.gbps:.2f}x"))


# ----- part 2: safe_open of one tensor -------------------------------------------------------------

def safetensors_state(total_bytes: int, seed: int) -> dict[str, torch.Tensor]:
    """``SAFETENSORS_TENSORS`` weight matrices of equal byte size, alternately bf16 and fp32."""
    gen = torch.Generator().manual_seed(seed)
    per = total_bytes // SAFETENSORS_TENSORS
    state: dict[str, torch.Tensor] = {}
    for i in range(SAFETENSORS_TENSORS):
        dtype = torch.bfloat16 if i % 2 == 0 else torch.float32
        elements = per // (2 if dtype == torch.bfloat16 else 4)
        cols = 2048 if elements % 2048 == 0 else 1
        value = torch.randn(elements // cols, cols, generator=gen) * 0.02
        state[f"layers.{i // 2}.{'attn' if i % 2 == 0 else 'mlp'}.weight"] = value.to(dtype)
    return state


def header_span(path: Path) -> tuple[int, dict[str, Any]]:
    """(bytes before the data section, the parsed safetensors header)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return 8 + length, json.loads(f.read(length))


def manifest_chunks(server: SeaweedServer, key: str) -> tuple[int, list[list[Any]]]:
    """(chunk size, chunk entries [id, length, stored, codec]) of a file's manifest, read from S3."""
    doc = json.loads(plain_client(server).get_object(Bucket=BUCKET_NVFS, Key=key)["Body"].read())
    return int(doc["chunk_size"]), doc["chunks"]


class CountingProxy:
    """A TCP relay in front of SeaweedFS's S3 port that counts what passes through it.

    The daemon of part 2's measuring mount talks S3 to this relay (``-o endpoint_url=``), so
    every byte S3 sends it (``received``: response headers and bodies) and every request it makes
    (``requests``: method and path, read from the request heads) is seen here, whatever the
    daemon logs. Requests are signed for the relay's host:port, which the server checks as sent.

    It runs in a process of its own (:class:`Relay`): safetensors holds the GIL while it maps and
    faults in the file, so a relay thread in this process would deadlock against that very read.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint_url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self.received = 0
        self.requests: list[tuple[str, str]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.received, len(self.requests)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        down = threading.Thread(target=self._pump_responses, args=(upstream, client), daemon=True)
        down.start()
        self._pump_requests(client, upstream)
        down.join()
        client.close()
        upstream.close()

    def _pump_responses(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(MIB):
                with self._lock:
                    self.received += len(data)
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def _pump_requests(self, src: socket.socket, dst: socket.socket) -> None:
        """Relay requests; note each one's method and path (skipping bodies by Content-Length)."""
        buffer, body_left, parsing = b"", 0, True
        with contextlib.suppress(OSError):
            while data := src.recv(MIB):
                dst.sendall(data)
                if not parsing:
                    continue
                buffer += data
                while True:
                    if body_left:
                        taken = min(body_left, len(buffer))
                        buffer, body_left = buffer[taken:], body_left - taken
                        if body_left:
                            break
                    end = buffer.find(b"\r\n\r\n")
                    if end < 0:
                        break
                    head, buffer = buffer[:end].decode("latin-1").split("\r\n"), buffer[end + 4:]
                    method, target = (head[0].split(" ") + ["", ""])[:2]
                    fields = (line.partition(":") for line in head[1:])
                    headers = {k.strip().lower(): v.strip() for k, _, v in fields}
                    with self._lock:
                        self.requests.append((method, target))
                    if "chunked" in headers.get("transfer-encoding", ""):
                        parsing = False  # no request of a read has a body; stop parsing rather than guess
                        break
                    body_left = int(headers.get("content-length", "0") or 0)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


class Relay:
    """A :class:`CountingProxy` in a child process, queried over a pipe."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._conn, child = multiprocessing.Pipe()
        self._process = multiprocessing.get_context("fork").Process(
            target=_relay_main, args=(upstream, child), daemon=True)
        self._process.start()
        child.close()
        self.endpoint_url: str = self._conn.recv()

    def _ask(self, what: str) -> Any:
        self._conn.send(what)
        return self._conn.recv()

    def snapshot(self) -> tuple[int, int]:
        """(bytes S3 has sent, requests made) so far."""
        return self._ask("snapshot")

    def requests(self) -> list[tuple[str, str]]:
        return self._ask("requests")

    def wait_until_quiet(self, quiet_s: float = 1.0, limit_s: float = 60.0) -> None:
        """Wait until no S3 traffic has passed for ``quiet_s`` (mount-time GC, read-ahead done)."""
        deadline = time.monotonic() + limit_s
        last, since = self.snapshot(), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.snapshot()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return

    def close(self) -> None:
        if self._process.is_alive():
            with contextlib.suppress(OSError, EOFError):
                self._ask("close")
            self._process.join(5)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
        self._conn.close()


def _relay_main(upstream: tuple[str, int], conn: Any) -> None:
    proxy = CountingProxy(upstream)
    conn.send(proxy.endpoint_url)
    with contextlib.suppress(EOFError, OSError):
        while (what := conn.recv()) != "close":
            conn.send(proxy.snapshot() if what == "snapshot" else list(proxy.requests))
    proxy.close()
    with contextlib.suppress(OSError):
        conn.send(None)


def part2(args: argparse.Namespace, server: SeaweedServer, work: Path, results: Results,
          options: str) -> None:
    state = safetensors_state(args.st_mib * MIB, args.seed + 1)
    names = list(state)
    pick = names[len(names) // 2 + 1]  # an fp32 tensor in the middle of the file
    mount = NvfsMount(server, f"s3://{BUCKET_NVFS}/st", work / "mnt-st", work / "nvfs-st.log", options)
    path = mount.mountpoint / "model.safetensors"
    proxy: Relay | None = None
    try:
        mount.mount()
        start = time.perf_counter()
        save_file(state, str(path))
        save_s = time.perf_counter() - start
        logical = path.stat().st_size
        stored = int(os.getxattr(path, XATTR + "stored_size"))
        results.add(Row("2", "setup: safetensors save_file through the mount", save_s, logical,
                        detail=f"{len(names)} tensors of {human(logical / len(names))}, "
                               f"stored {human(stored)}"))
        mount.umount()

        proxy = Relay(("127.0.0.1", server.s3_port))
        mount.mount(endpoint_url=proxy.endpoint_url)
        proxy.wait_until_quiet()  # the mount-time garbage-collection pass lists the store
        drop_caches()
        received0, requests0 = proxy.snapshot()
        start = time.perf_counter()
        with safe_open(str(path), framework="pt") as f:
            # get_tensor maps the file lazily: clone() touches every page, as loading it would.
            tensor = f.get_tensor(pick).clone()
        open_s = time.perf_counter() - start
        gc.collect()  # the mapping goes with the lazy tensor; an open mapping would keep the mount busy
        proxy.wait_until_quiet()  # read-ahead the access started counts as fetched for it
        received1, _ = proxy.snapshot()
        received = received1 - received0
        requests = proxy.requests()[requests0:]
        if not torch.equal(tensor, state[pick]):
            raise AssertionError(f"safe_open returned a different {pick}")
        del tensor

        # What the access needed at least: the chunks the header and the tensor overlap.
        data_start, header = header_span(path)
        begin, end = (data_start + x for x in header[pick]["data_offsets"])
        chunk_size, chunks = manifest_chunks(server, "st/tree/model.safetensors")
        needed = set(range((data_start - 1) // chunk_size + 1))
        needed |= set(range(begin // chunk_size, (end - 1) // chunk_size + 1))
        minimum = sum(chunks[i][2] for i in needed if chunks[i] is not None)
    finally:
        mount.close()
        if proxy is not None:
            proxy.close()
    # Chunk GETs and their stored (= object) sizes, from the request paths and the manifest.
    stored_of = {entry[0]: entry[2] for entry in chunks if entry is not None}
    fetched = [t.rsplit("/", 1)[1].split("?")[0] for m, t in requests if m == "GET" and "/chunks/" in t]
    get_bytes = sum(stored_of.get(cid, 0) for cid in fetched)
    other = len(requests) - len(fetched)
    share = received / stored
    results.add(Row("2", "nvfs cold: safe_open + get_tensor().clone()", open_s, None,
                    detail=f"S3 sent {human(received)} = {share:.2%} of stored: {len(fetched)} chunk GETs "
                           f"({len(set(fetched))} distinct), {human(get_bytes)} = {get_bytes / stored:.2%}, "
                           f"+{other} other requests; least possible {len(needed)} chunks, "
                           f"{human(minimum)} = {minimum / stored:.2%}"))
    index_of = {entry[0]: i for i, entry in enumerate(chunks) if entry is not None}
    results.notes.append(f"part 2: {path.name} {logical:,} B logical, {stored:,} B stored "
                         f"(sum of user.nvfs.stored_size), {len(chunks)} chunks of {human(chunk_size)}; "
                         f"tensor {pick} is {human(end - begin)} at bytes {begin:,}..{end:,}; chunks "
                         f"needed {ranges(needed)}, fetched {ranges(index_of[c] for c in fetched)}")
    results.acceptance.append((
        f"safe_open of one tensor fetched < {FETCH_TARGET:.0%} of stored bytes",
        received < FETCH_TARGET * stored,
        f"S3 sent {human(received)} = {share:.2%} of {human(stored)} stored ({len(fetched)} chunk GETs, "
        f"{human(get_bytes)}); least possible {minimum / stored:.2%}"))


# ----- part 3: peak RSS ---------------------------------------------------------------------------------

class RssSampler(threading.Thread):
    """Samples the VmRSS of a daemon and its fetch processes every ``RSS_INTERVAL`` seconds.

    Their shared slots are counted once (:func:`benchmarks.common.tree_status`). Remembers the
    peak and its phase.
    """

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.phase = "start"
        self.peak = 0
        self.peak_phase = ""
        self.samples = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            rss = tree_status(self.pid, "VmRSS")
            if rss is None:
                return
            self.samples += 1
            if rss > self.peak:
                self.peak, self.peak_phase = rss, self.phase
            self._stop_event.wait(RSS_INTERVAL)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def block_pool(seed: int) -> bytes:
    """64 MiB + one block of N(0, 0.02) fp32 values rounded to bf16 precision: ~2-3x compressible."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal((64 * MIB + BLOCK) // 4, dtype=np.float32) * 0.02).view(np.uint32)
    return (values & np.uint32(0xFFFF0000)).tobytes()


def block(pool: bytes, index: int) -> bytes:
    """Block ``index`` of the RSS file: a window into the pool, made unique by a 16-byte stamp."""
    offset = (index * 2_654_435_761 % (64 * MIB // 4)) * 4
    return struct.pack("<QQ", index, 0x6E766673) + pool[offset + 16 : offset + BLOCK]


def part3(args: argparse.Namespace, server: SeaweedServer, work: Path, results: Results,
          options: str, bound: int) -> None:
    blocks = args.rss_mib * MIB // BLOCK
    size = blocks * BLOCK
    pool = block_pool(args.seed + 2)
    mount = NvfsMount(server, f"s3://{BUCKET_NVFS}/rss", work / "mnt-rss", work / "nvfs-rss.log", options)
    path = mount.mountpoint / "big.bin"
    try:
        pid = mount.mount()
        idle_rss = tree_status(pid, "VmRSS")
        sampler = RssSampler(pid)
        sampler.start()
        try:
            sampler.phase = "write"
            cpu0 = tree_cpu_seconds(pid)
            start = time.perf_counter()
            with open(path, "wb", buffering=0) as f:
                for i in range(blocks):
                    f.write(block(pool, i))
            write_s = time.perf_counter() - start
            write_cpu = tree_cpu_seconds(pid) - cpu0
            stored = int(os.getxattr(path, XATTR + "stored_size"))
            write_peak = sampler.peak
            sampler.phase = "read"
            drop_caches()
            cpu0 = tree_cpu_seconds(pid)
            read_s = timed_cat(path)
            read_cpu = tree_cpu_seconds(pid) - cpu0
            hwm = tree_status(pid, "VmHWM")
            own_hwm = proc_status(pid, "VmHWM")
        finally:
            sampler.stop()
        # Spot check (untimed): a few blocks read back equal what was written.
        with open(path, "rb", buffering=0) as f:
            for i in sorted({0, blocks - 1, blocks // 3, blocks // 2, (2 * blocks) // 3}):
                f.seek(i * BLOCK)
                if f.read(BLOCK) != block(pool, i):
                    raise AssertionError(f"block {i} of {path.name} reads back different")
    finally:
        mount.close()
    peak = max(sampler.peak, hwm)
    results.add(Row("3", f"nvfs write {human(size)} (4 MiB writes) + close", write_s, size,
                    detail=f"stored {human(stored)} (ratio {size / stored:.2f}x), "
                           f"daemon CPU {write_cpu:.1f} s, peak VmRSS while writing {human(write_peak)}"))
    results.add(Row("3", f"nvfs cold read {human(size)}: cat > /dev/null", read_s, size,
                    detail=f"daemon CPU {read_cpu:.1f} s; spot-checked 5 blocks bit-exact"))
    results.add(Row("3", "daemon peak RSS over write + read", math.nan, None,
                    detail=f"daemon + fetch processes: sampled VmRSS peak {human(sampler.peak)} "
                           f"(during {sampler.peak_phase}, {sampler.samples} samples), VmHWM {human(hwm)}, "
                           f"idle after mount {human(idle_rss)}; bound {human(bound)}; daemon alone: "
                           f"VmHWM {human(own_hwm)}"))
    results.acceptance.append((
        "daemon peak RSS < cache_size + max_inflight + 256 MiB",
        peak < bound,
        f"peak {human(peak)} (max of sampled VmRSS and VmHWM) vs bound {human(bound)} "
        f"= {peak / bound:.0%} of it"))


# ----- main ---------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size-mib", type=int, default=2048,
                        help="checkpoint size for part 1 (default 2048)")
    parser.add_argument("--st-mib", type=int, default=1024,
                        help=f"safetensors size for part 2, {SAFETENSORS_TENSORS} tensors (default 1024)")
    parser.add_argument("--rss-mib", type=int, default=8192, help="file size for part 3 (default 8192)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="parent of the benchmark's fresh temp dir (default /var/tmp)")
    parser.add_argument("--mount-options", default="",
                        help="extra nvfs -o options for every mount, e.g. cache_size=512M,readahead=128M")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 256 MiB checkpoint, 64 MiB safetensors, 512 MiB RSS run")
    parser.add_argument("--adam-steps", type=int, default=3, help="AdamW steps to build optimizer state")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (S3 data, logs)")
    parser.add_argument("--parts", default="123", help="which parts to run (default 123)")
    parser.add_argument("--trials", type=int, default=3,
                        help="cold cats of part 1, each followed by a cold get_object; medians count "
                             "(default 3)")
    parser.add_argument("--compare", action="append", default=[], metavar="OPTIONS",
                        help="instead of part 1's rows: cold cats with the mount options and with "
                             "these extra -o options (repeatable), in turn, --trials rounds")
    args = parser.parse_args(argv)
    if not set(args.parts) <= set("123"):
        parser.error("--parts takes digits among 1, 2 and 3")
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    if args.quick:
        args.size_mib, args.st_mib, args.rss_mib = 256, 64, 512
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    config = parse_options([args.mount_options]).vfs  # what the daemon will run with
    bound = config.cache_size + config.max_inflight + HEADROOM
    work = make_workdir(args.workdir, "nvfs-bench-s3-")
    weed = subprocess.run(["weed", "version"], capture_output=True, text=True).stdout.strip().splitlines()
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"machine: {machine_info(work)}, SeaweedFS {weed[0] if weed else '?'} on the same machine")
    print(f"workdir: {work}")
    extra = f",{args.mount_options}" if args.mount_options else ""
    print(f"mount options: endpoint_url=<local SeaweedFS>,log_file=<workdir>{extra} "
          f"(part 2's measuring mount: endpoint_url=<counting relay>); effective: "
          f"chunk_size={human(config.chunk_size)}, cache_size={human(config.cache_size)}, "
          f"max_inflight={human(config.max_inflight)}, max_dirty={human(config.max_dirty)}, "
          f"readahead={human(config.readahead)}, threads={config.threads}, "
          f"metadata_ttl={f'{config.metadata_ttl:g} s' if config.metadata_ttl is not None else '5 s (S3)'}")
    print(f"before: {other_load()}")
    print(f"RSS bound: cache_size + max_inflight + 256 MiB = {human(bound)}")
    print(f"sizes: checkpoint {args.size_mib} MiB, safetensors {args.st_mib} MiB, RSS run {args.rss_mib} MiB",
          flush=True)
    started = time.perf_counter()
    results = Results()
    server = SeaweedServer(work / "seaweed")
    try:
        server.start()
        server.create_bucket(BUCKET_NVFS)
        server.create_bucket(BUCKET_PLAIN)
        print(f"SeaweedFS up in {server.start_seconds:.1f} s at {server.endpoint_url}", flush=True)
        if args.compare:
            compare_options(args, server, work, results, args.mount_options)
        elif "1" in args.parts:
            part1(args, server, work, results, args.mount_options)
        if "2" in args.parts:
            part2(args, server, work, results, args.mount_options)
        if "3" in args.parts:
            part3(args, server, work, results, args.mount_options, bound)
        print()
        print_table(results)
        print("\nacceptance:")
        for name, ok, detail in results.acceptance:
            print(f"  [{'PASS' if ok else 'FAIL'}] {name}: {detail}")
        met = sum(ok for _, ok, _ in results.acceptance)
        print(f"  {met} of {len(results.acceptance)} met")
        print(f"\ntotal runtime {time.perf_counter() - started:.1f} s; after: {other_load(server.pid)}")
    except BaseException:
        if results.rows:
            print("\npartial results:")
            print_table(results)
        for log_file in sorted(work.glob("nvfs-*.log")):
            text = log_file.read_text(errors="replace").splitlines()
            lines = [line for line in text if " DEBUG " not in line][-30:]
            print(f"{log_file.name} (last 30 lines without DEBUG):\n" + "\n".join(lines), file=sys.stderr)
        print(f"weed log (tail):\n{server.log_tail(20)}", file=sys.stderr)
        raise
    finally:
        for mnt in sorted(work.glob("mnt-*")):
            if os.path.ismount(mnt):
                subprocess.run([*NVFS, "umount", str(mnt)], capture_output=True, timeout=900, check=False)
                if os.path.ismount(mnt):
                    subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
        server.close()
        if args.keep:
            print(f"kept {work}")
        elif not any(os.path.ismount(mnt) for mnt in work.glob("mnt-*")):
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
