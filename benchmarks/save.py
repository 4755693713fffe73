"""Time ``torch.save`` / ``torch.load`` of a ~1 GiB mixed-precision checkpoint: plain directory vs nvfs.

Why this benchmark: nvfs exists to make checkpoint saves cheaper in bytes without making them
slower in wall time, so the honest comparison is the same ``torch.save`` call, with the same
durability guarantee, into a plain directory and into an nvfs mount, both on the same disk.

* Both targets: ``torch.save`` then ``fsync`` (without fsync the bytes may still sit in the
  page cache; on nvfs the commit follows the last close and fsync waits for it). Whether
  nvfs's commit really happened is checked through the ``user.nvfs.committed`` xattr.

Loads are cold: the plain file and the store's objects are evicted from the page cache
(``posix_fadvise(DONTNEED)``) and nvfs is remounted, so neither side reads from memory.

The checkpoint is built in memory, seeded, like a real mixed-precision training state:
bf16 model weights, fp32 master weights and AdamW ``exp_avg`` / ``exp_avg_sq`` produced by
actually running a few AdamW steps on a random linear regression (so the optimizer state has
the structure of real moments, not i.i.d. noise). Embedding rows of tokens never sampled keep
all-zero optimizer state, as in real training.

Run as root (FUSE)::

    python3 benchmarks/save.py --size-mib 1024
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks.common import NVFS, XATTR, fsync_path, make_workdir, raise_on_sigterm  # noqa: E402

# AdamW state bytes per parameter: bf16 weight + fp32 master + exp_avg + exp_avg_sq.
BYTES_PER_PARAM = 2 + 4 + 4 + 4
HIDDEN_CHOICES = (2048, 1024, 512, 256, 128)
MIN_LAYERS = 4


# ----- building the checkpoint --------------------------------------------------------------

@dataclass(frozen=True)
class ModelShape:
    """A GPT-style decoder: tied embedding, ``layers`` blocks of ``12 * hidden**2`` weights."""

    hidden: int
    layers: int
    vocab: int

    def parameters(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every parameter, in the order a model's ``state_dict`` has them."""
        h = self.hidden
        yield "embed.weight", (self.vocab, h)
        for i in range(self.layers):
            p = f"layers.{i}."
            yield p + "ln1.weight", (h,)
            yield p + "ln1.bias", (h,)
            yield p + "attn.qkv.weight", (3 * h, h)
            yield p + "attn.proj.weight", (h, h)
            yield p + "ln2.weight", (h,)
            yield p + "ln2.bias", (h,)
            yield p + "mlp.fc.weight", (4 * h, h)
            yield p + "mlp.proj.weight", (h, 4 * h)
        yield "final_ln.weight", (h,)
        yield "final_ln.bias", (h,)


def choose_shape(size_bytes: int, hidden: int | None) -> ModelShape:
    """Fit a model to ``size_bytes`` of training state: ~70% in layers, the rest in the embedding.

    Without ``--hidden`` the largest hidden size that still fits ``MIN_LAYERS`` layers is
    taken, so small sizes still get several layers rather than one huge matrix.
    """
    params = size_bytes // BYTES_PER_PARAM
    if hidden is None:
        fits = [h for h in HIDDEN_CHOICES if 0.7 * params >= MIN_LAYERS * 12 * h * h]
        hidden = fits[0] if fits else HIDDEN_CHOICES[-1]
    layers = max(1, round(0.7 * params / (12 * hidden * hidden)))
    per_layer = 12 * hidden * hidden + 4 * hidden
    vocab = max(64, (params - layers * per_layer - 2 * hidden) // hidden // 64 * 64)
    return ModelShape(hidden, layers, vocab)


def fit_shape(size_bytes: int) -> ModelShape:
    """``choose_shape``, with the vocabulary grown so the state is at least ``size_bytes``."""
    shape = choose_shape(size_bytes, None)
    params = sum(math.prod(dims) for _, dims in shape.parameters())
    deficit = size_bytes - params * BYTES_PER_PARAM
    if deficit > 0:
        rows = -(-deficit // (BYTES_PER_PARAM * shape.hidden))
        shape = ModelShape(shape.hidden, shape.layers, shape.vocab + -(-rows // 64) * 64)
    return shape


def _init_master(shape: ModelShape, gen: torch.Generator) -> dict[str, torch.nn.Parameter]:
    """fp32 master weights: N(0, 0.02) matrices, LayerNorm weights 1 and biases 0 (GPT-2 init)."""
    master: dict[str, torch.nn.Parameter] = {}
    for name, dims in shape.parameters():
        if len(dims) == 2:
            value = torch.randn(dims, generator=gen) * 0.02
        else:
            value = torch.ones(dims) if name.endswith("weight") else torch.zeros(dims)
        master[name] = torch.nn.Parameter(value)
    return master


def _embedding_grad(vocab: int, hidden: int, gen: torch.Generator) -> torch.Tensor:
    """Embedding gradient of one large batch: Zipf token counts, zero rows for unused tokens.

    The last 2% of the vocabulary stands for reserved tokens that never occur, so their rows
    keep all-zero Adam state; the rest is sampled 16 times per row on average with Zipf
    frequencies, so a few rare tokens are missed too. A row hit ``c`` times gets the sum of
    ``c`` N(0, 1) vectors, drawn directly as ``sqrt(c) * N(0, 1)`` to stay cheap.
    """
    used = vocab - vocab // 50
    weights = 1.0 / torch.arange(1, used + 1, dtype=torch.float64)
    ids = torch.multinomial(weights, 16 * used, replacement=True, generator=gen)
    counts = torch.bincount(ids, minlength=vocab).to(torch.float32)
    return torch.randn(vocab, hidden, generator=gen) * counts.sqrt().unsqueeze(1)


def _regression_grad(weight: torch.Tensor, batch: int, gen: torch.Generator) -> torch.Tensor:
    """Gradient of ``0.5 * ||X W^T - Y||^2 / batch`` for random inputs X and targets Y."""
    out_dim, in_dim = weight.shape
    x = torch.randn(batch, in_dim, generator=gen)
    y = torch.randn(batch, out_dim, generator=gen) * 0.5
    residual = x @ weight.detach().T - y
    return residual.T @ x / batch


def _set_grads(master: dict[str, torch.nn.Parameter], vocab: int, gen: torch.Generator,
               batch: int) -> None:
    """One training step's gradients: regression for matrices, sparse rows for the embedding."""
    for name, param in master.items():
        if name == "embed.weight":
            param.grad = _embedding_grad(vocab, param.shape[1], gen)
        elif param.dim() == 2:
            param.grad = _regression_grad(param, batch, gen)
        else:
            param.grad = torch.randn(param.shape, generator=gen) * 0.1


def build_state(shape: ModelShape, seed: int, steps: int) -> dict[str, Any]:
    """Run ``steps`` AdamW steps (grad clipping at 1.0, as in LLM training) and return the state.

    Layout follows common mixed-precision trainers: bf16 ``model`` weights, fp32
    ``master_weights`` that the optimizer updates, the optimizer's ``state_dict`` and a little
    bookkeeping.
    """
    gen = torch.Generator().manual_seed(seed)
    master = _init_master(shape, gen)
    optimizer = torch.optim.AdamW(master.values(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=0.1, foreach=True)
    for _ in range(steps):
        _set_grads(master, shape.vocab, gen, batch=64)
        torch.nn.utils.clip_grad_norm_(master.values(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {
        "model": {name: p.detach().to(torch.bfloat16) for name, p in master.items()},
        "master_weights": {name: p.detach() for name, p in master.items()},
        "optimizer": optimizer.state_dict(),
        "iteration": steps,
        "args": {"hidden": shape.hidden, "layers": shape.layers, "vocab": shape.vocab, "seed": seed},
    }


def tensors(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a nested dict/list structure, with a dotted path, in a stable order."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from tensors(value, f"{prefix}.{i}" if prefix else str(i))


def zero_row_fraction(state: dict[str, Any]) -> float:
    """Share of embedding rows whose ``exp_avg_sq`` is all zero (tokens never seen)."""
    exp_avg_sq = state["optimizer"]["state"][0]["exp_avg_sq"]
    return float((exp_avg_sq == 0).all(dim=1).float().mean())


# ----- files, caches, mounts -------------------------------------------------------------------

def tree_bytes(root: Path) -> int:
    """Sum of the sizes of every regular file under ``root`` (what the store costs on disk)."""
    total = 0
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            if os.path.isfile(path) and not os.path.islink(path):
                total += os.path.getsize(path)
    return total


def evict(path: Path) -> None:
    """Write back and drop ``path``'s pages from the page cache so the next read hits the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def evict_tree(root: Path) -> None:
    """:func:`evict` every regular file under ``root``."""
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = Path(directory, name)
            if path.is_file() and not path.is_symlink():
                evict(path)


def run_nvfs(*args: str, timeout: float = 900) -> None:
    """Run the ``nvfs`` command line; a failure becomes an exception with its stderr."""
    result = subprocess.run([*NVFS, *args], capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"nvfs {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")


@contextlib.contextmanager
def nvfs_mounted(store: Path, mountpoint: Path, log_file: Path, extra: str | None) -> Iterator[Path]:
    """Mount ``store`` on ``mountpoint`` for the ``with`` body; always unmount, even on error.

    If a clean ``nvfs umount`` fails (daemon hung), fall back to a lazy unmount so the
    benchmark never leaves a mount behind.
    """
    options = ",".join(filter(None, (f"log_file={log_file}", extra)))
    run_nvfs("mount", str(store), str(mountpoint), "-o", options, timeout=120)
    try:
        yield mountpoint
    finally:
        if os.path.ismount(mountpoint):
            try:
                run_nvfs("umount", str(mountpoint))
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"warning: {exc}; lazy unmount", file=sys.stderr)
                subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)


# ----- measuring -------------------------------------------------------------------------------

@dataclass
class Result:
    """One row of the table."""

    target: str
    logical: int
    stored: int
    save_s: float
    load_s: float = math.nan
    note: str = ""


def timed_save(state: dict[str, Any], path: Path, fsync: bool) -> float:
    """Seconds for ``torch.save`` (which closes the file) and, if asked, an ``fsync`` after it."""
    start = time.perf_counter()
    torch.save(state, path)
    if fsync:
        fsync_path(path)
    return time.perf_counter() - start


def timed_load(path: Path, state: dict[str, Any]) -> float:
    """Seconds for ``torch.load``; then check every tensor against the original, bit for bit."""
    start = time.perf_counter()
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    elapsed = time.perf_counter() - start
    verify(state, loaded)
    del loaded
    gc.collect()
    return elapsed


def verify(expected: dict[str, Any], actual: dict[str, Any]) -> None:
    """Raise if any tensor differs in name, dtype, shape or bits (wrong data is a bug)."""
    want, got = list(tensors(expected)), list(tensors(actual))
    if [name for name, _ in want] != [name for name, _ in got]:
        raise AssertionError("loaded checkpoint has different tensor names")
    for (name, a), (_, b) in zip(want, got, strict=True):
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            raise AssertionError(f"loaded tensor {name} differs from the saved one")


def bench_plain(state: dict[str, Any], directory: Path) -> Result:
    """Save + fsync into a plain directory, then a cold load."""
    directory.mkdir()
    path = directory / "ckpt.pt"
    save_s = timed_save(state, path, fsync=True)
    size = path.stat().st_size
    result = Result("plain dir", size, size, save_s, note="torch.save + fsync")
    evict(path)
    result.load_s = timed_load(path, state)
    return result


def bench_nvfs(state: dict[str, Any], work: Path, engine: str, mount_options: str | None) -> Result:
    """Save into a fresh nvfs mount (durable once fsync returns), unmount, remount, then a cold load."""
    work = work / f"nvfs-{engine}"
    store, mnt, log_file = work / "store", work / "mnt", work / "nvfs.log"
    for directory in (store, mnt):
        directory.mkdir(parents=True)
    mount_options = ",".join(filter(None, (f"engine={engine}", mount_options)))
    with nvfs_mounted(store, mnt, log_file, mount_options):
        path = mnt / "ckpt.pt"
        save_s = timed_save(state, path, fsync=True)  # the commit follows close; fsync waits for it
        committed = os.getxattr(path, XATTR + "committed").decode()
        xattr_stored = int(os.getxattr(path, XATTR + "stored_size"))
        logical = path.stat().st_size
        umount_start = time.perf_counter()
    umount_s = time.perf_counter() - umount_start
    stored = tree_bytes(store)
    note = (f"committed after fsync: {committed}; xattr stored_size {xattr_stored}; "
            f"umount {umount_s:.2f}s")
    result = Result(f"nvfs {engine}", logical, stored, save_s, note=note)
    evict_tree(store)
    with nvfs_mounted(store, mnt, log_file, mount_options):
        result.load_s = timed_load(mnt / "ckpt.pt", state)
    return result


# ----- reporting -------------------------------------------------------------------------------

def machine_info(work: Path) -> str:
    """nproc, CPU, memory, kernel and versions: what the numbers depend on."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "?")
    mem_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:"))
    fs = subprocess.run(["df", "--output=fstype,source", str(work)], capture_output=True, text=True)
    fs_desc = " ".join(fs.stdout.split()[2:]) if fs.returncode == 0 else "?"
    return (f"nproc {len(os.sched_getaffinity(0))} ({cpu}), {mem_kib / 2**20:.1f} GiB RAM, "
            f"kernel {platform.release()}, python {platform.python_version()}, torch {torch.__version__}, "
            f"torch threads {torch.get_num_threads()}, workdir fs {fs_desc}")


def print_table(rows: list[Result]) -> None:
    """The one table: seconds, logical GB/s (1 GB = 1e9 bytes), stored bytes and ratio."""
    header = (f"{'target':<10} {'save s':>8} {'save GB/s':>10} {'load s':>8} {'load GB/s':>10} "
              f"{'logical bytes':>14} {'stored bytes':>14} {'ratio':>7}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.target:<10} {r.save_s:>8.2f} {r.logical / r.save_s / 1e9:>10.3f} {r.load_s:>8.2f} "
              f"{r.logical / r.load_s / 1e9:>10.3f} {r.logical:>14,} {r.stored:>14,} "
              f"{r.logical / r.stored:>6.3f}x")
    for r in rows:
        print(f"  {r.target}: {r.note}")


# ----- main ------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="training state size (default 1024)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="parent of the benchmark's fresh temp dir (default /var/tmp)")
    parser.add_argument("--mount-options", default=None, help="extra nvfs -o options, e.g. level=1,threads=8")
    parser.add_argument("--engines", default="auto",
                        help="nvfs engines to compare, comma-separated (auto, cpu, gpu; default auto)")
    parser.add_argument("--hidden", type=int, default=None, help="hidden size (default: by size)")
    parser.add_argument("--adam-steps", type=int, default=3, help="AdamW steps to build optimizer state")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (files, store, log)")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, work: Path) -> None:
    """Build the state, run both targets, print the table."""
    started = time.perf_counter()
    shape = choose_shape(args.size_mib << 20, args.hidden)
    state = build_state(shape, args.seed, args.adam_steps)
    total = sum(t.numel() * t.element_size() for _, t in tensors(state))
    print(f"state: {total / 2**20:.0f} MiB in {len(list(tensors(state)))} tensors; hidden {shape.hidden}, "
          f"{shape.layers} layers, vocab {shape.vocab}, {args.adam_steps} AdamW steps, "
          f"{zero_row_fraction(state):.1%} embedding rows with all-zero Adam state; "
          f"built in {time.perf_counter() - started:.1f}s", flush=True)
    rows = [bench_plain(state, work / "plain")]
    rows += [bench_nvfs(state, work, engine, args.mount_options) for engine in args.engines.split(",")]
    print()
    print_table(rows)
    print(f"\ntotal runtime {time.perf_counter() - started:.1f}s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    work = make_workdir(args.workdir, "nvfs-bench-save-")
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"machine: {machine_info(work)}")
    print(f"workdir: {work}", flush=True)
    try:
        run(args, work)
    except Exception:
        for log_file in sorted(work.glob("nvfs-*/nvfs.log")):
            tail = log_file.read_text(errors="replace").splitlines()[-30:]
            print(f"{log_file} (last 30 lines):\n" + "\n".join(tail), file=sys.stderr)
        raise
    finally:
        if args.keep:
            print(f"kept {work}")
        elif not any(os.path.ismount(mountpoint) for mountpoint in work.glob("nvfs-*/mnt")):
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
