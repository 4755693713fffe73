"""Helpers shared by the benchmarks (save.py, write.py, s3_read.py, read_ceiling.py); no torch here."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NVFS = [sys.executable, "-m", "nvfs"]
XATTR = "user.nvfs."
MIB = 1 << 20
GIB = 1 << 30


def human(size: float) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(size) >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size:.0f} B"


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


def proc_status(pid: int, key: str) -> int | None:
    """A ``kB`` field of /proc/PID/status (VmRSS, VmHWM) in bytes; None once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return None  # a zombie has no Vm* lines


def children_of(pid: int) -> list[int]:
    """Live child processes of ``pid`` (an nvfs daemon's fetch processes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def tree_status(pid: int, key: str) -> int | None:
    """:func:`proc_status` of ``pid`` plus its children's (an nvfs daemon's fetch processes).

    Nothing is counted twice: a child maps the memory of a chunk while it decodes it, and the
    daemon maps it only once the child has let go of it. Summed peaks (VmHWM) may come from
    different moments: an upper bound.
    """
    own = proc_status(pid, key)
    if own is None:
        return None
    return own + sum(proc_status(child, key) or 0 for child in children_of(pid))


def rss_with_write_processes(pid: int) -> int | None:
    """VmRSS of ``pid`` plus its children's, each child's shared memory left out.

    A write process's shared memory is the daemon's chunk buffers, which the daemon wrote
    and its own VmRSS holds already.
    """
    own = proc_status(pid, "VmRSS")
    if own is None:
        return None
    return own + sum(max(0, (proc_status(child, "VmRSS") or 0) - (proc_status(child, "RssShmem") or 0))
                     for child in children_of(pid))


def tree_cpu_seconds(pid: int | None) -> float:
    """:func:`cpu_seconds` of ``pid`` plus its live children's."""
    if pid is None:
        return math.nan
    return cpu_seconds(pid) + sum(cpu_seconds(child) for child in children_of(pid))


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (NaN if it is gone)."""
    if pid is None:
        return math.nan
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def raise_on_sigterm(signum: int, _frame: object) -> None:
    """Turn SIGTERM into SystemExit so ``finally`` blocks unmount and clean up."""
    raise SystemExit(128 + signum)


def make_workdir(parent: Path | None, prefix: str) -> Path:
    """A fresh temp dir for one run, under ``parent`` (default /var/tmp, created if missing)."""
    parent = parent or Path("/var/tmp")
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
