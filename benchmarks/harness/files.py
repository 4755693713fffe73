"""Files and the page cache: what a benchmark reads, sums, syncs and evicts around a timed step."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.harness.units import MIB


def drop_caches() -> None:
    """Write back dirty pages and drop the page cache, dentries and inodes (needs root)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as exc:
        raise SystemExit(f"cannot drop the page cache ({exc}); run as root") from None


def timed_cat(path: Path) -> float:
    """Seconds for ``cat FILE > /dev/null``."""
    start = time.perf_counter()
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(8 * MIB):
            digest.update(block)
    return digest.hexdigest()


def fsync_path(path: Path) -> None:
    """``fsync`` a file by name (on a fresh descriptor): its data is on disk when this returns."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def regular_files(root: Path) -> list[Path]:
    """Every regular file under ``root`` (symbolic links left out)."""
    paths = (Path(directory, name) for directory, _dirs, names in os.walk(root) for name in names)
    return [path for path in paths if path.is_file() and not path.is_symlink()]


def tree_bytes(root: Path) -> int:
    """Sum of the sizes of every regular file under ``root`` (what a store costs on disk)."""
    return sum(path.stat().st_size for path in regular_files(root))


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
    for path in regular_files(root):
        evict(path)


def read_files_below(directory: Path) -> None:
    """Read every regular file under ``directory`` into the page cache."""
    buffer = bytearray(8 * MIB)
    for path in regular_files(directory):
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass


def log_tail(path: Path, lines: int = 30, skip: str | None = None) -> str:
    """The last ``lines`` lines of a log (those containing ``skip`` left out), or why there are none."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join([line for line in text if skip is None or skip not in line][-lines:])


def make_workdir(parent: Path | None, prefix: str) -> Path:
    """A fresh temp dir for one run, under ``parent`` (default /var/tmp, created if missing)."""
    parent = parent or Path("/var/tmp")
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
