"""One way to mount, unmount and clean up the filesystems a benchmark measures: nvfs and JuiceFS.

Every mount is also unmounted after errors and SIGTERM: a clean unmount first, and if that
fails a lazy one and a kill of the daemon, so that a benchmark never leaves a mount behind (and
never deletes its temp dir through one: :func:`unmount_below` first).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from nvfs.testing.procfs import alive

NVFS = [sys.executable, "-m", "nvfs"]
XATTR = "user.nvfs."


def run_checked(command: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    """Run a command; a failure becomes RuntimeError with its stderr. Returns stdout."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    if result.returncode != 0:
        output = (result.stderr.strip() or result.stdout.strip()).splitlines()[-5:]
        raise RuntimeError(f"{shlex.join(command)} failed ({result.returncode}): {' | '.join(output)}")
    return result.stdout


def mount_points() -> list[str]:
    """Every mount point, from /proc/self/mounts (octal escapes such as ``\\040`` undone)."""
    with open("/proc/self/mounts") as mounts:
        return [fields[1].encode().decode("unicode_escape") for line in mounts
                if len(fields := line.split()) > 1]


def is_mounted(path: Path) -> bool:
    """Whether something is mounted on ``path``.

    Unlike ``os.path.ismount`` this also sees a FUSE mount whose daemon died (stat on it fails
    with ENOTCONN), which still has to be unmounted.
    """
    return os.path.abspath(path) in mount_points()


def lazy_unmount(path: Path | str) -> None:
    """``fusermount3 -u -z``: detach now, whatever still uses the mount."""
    subprocess.run(["fusermount3", "-u", "-z", str(path)], check=False, capture_output=True)


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``pid`` to exit; True if it did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def kill(pid: int | None) -> None:
    """SIGKILL ``pid`` if it still runs."""
    if pid is not None and alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def clean_unmount(mnt: Path, umount: Callable[[], object]) -> bool:
    """``umount()`` if something is mounted on ``mnt``; True if that worked.

    If it fails, unmount lazily (the caller then stops the daemon) and return False; also False
    when nothing was mounted.
    """
    if not is_mounted(mnt):
        return False
    try:
        umount()
        return True
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"warning: {exc}; lazy unmount", file=sys.stderr)
        lazy_unmount(mnt)
        return False


def unmount_below(root: Path) -> list[str]:
    """Lazily unmount whatever is still mounted below ``root``; returns what could not be."""
    prefix = os.path.abspath(root) + "/"
    for point in sorted((p for p in mount_points() if p.startswith(prefix)), reverse=True):
        print(f"warning: {point} still mounted; lazy unmount", file=sys.stderr)
        lazy_unmount(point)
    return [p for p in mount_points() if p.startswith(prefix)]


class NvfsMount:
    """One nvfs daemon on ``source`` (a directory or ``s3://bucket/prefix``) at ``mnt``.

    ``env`` (S3 credentials) goes to the daemon; ``endpoint_url``, where given, to its options.
    Mounted and unmounted on demand, with extra options per mount.
    """

    def __init__(self, source: str, mnt: Path, log: Path, options: str = "",
                 env: dict[str, str] | None = None, endpoint_url: str | None = None) -> None:
        self.source, self.mnt, self.log, self.options = source, mnt, log, options
        self.env = {**os.environ, **(env or {})}
        self.endpoint_url = endpoint_url
        self.pid: int | None = None
        mnt.mkdir(parents=True, exist_ok=True)

    def mount(self, extra: str = "", endpoint_url: str | None = None) -> int:
        """Mount with the mount's options plus ``extra``; returns the daemon's pid."""
        endpoint = endpoint_url or self.endpoint_url
        options = ",".join(filter(None, (endpoint and f"endpoint_url={endpoint}", f"log_file={self.log}",
                                         self.options, extra)))
        run_checked([*NVFS, "mount", self.source, str(self.mnt), "-o", options], timeout=120, env=self.env)
        self.pid = int(os.getxattr(self.mnt, XATTR + "pid"))
        return self.pid

    def umount(self) -> float:
        """Unmount and wait for the daemon to exit; returns the seconds that took."""
        start = time.perf_counter()
        run_checked([*NVFS, "umount", str(self.mnt)], timeout=900, env=self.env)
        self.pid = None
        return time.perf_counter() - start

    def remount(self, extra: str = "") -> int:
        self.umount()
        return self.mount(extra)

    def close(self) -> None:
        """Unmount if mounted; if a clean unmount fails, unmount lazily and kill our daemon."""
        pid = self.pid
        if clean_unmount(self.mnt, self.umount):
            return
        if pid is not None and not wait_gone(pid, 30):
            kill(pid)

    @contextlib.contextmanager
    def mounted(self, extra: str = "") -> Iterator[Path]:
        """Mounted for the ``with`` body; always unmounted after it, also on errors."""
        self.mount(extra)
        try:
            yield self.mnt
        finally:
            self.close()


class JuiceFsMount:
    """``juicefs mount -d`` of one volume; remembers the serving and supervisor pids (from .config)."""

    def __init__(self, meta_url: str, mnt: Path, place: Path) -> None:
        self.meta_url, self.mnt, self.place = meta_url, mnt, place
        self.log = place / "juicefs.log"
        self.pid: int | None = None
        self.ppid: int | None = None

    def mount(self) -> int:
        command = ["juicefs", "mount", "-d", "--log", str(self.log), "--cache-dir", str(self.place / "cache"),
                   "--no-usage-report", self.meta_url, str(self.mnt)]
        run_checked(command, timeout=120)
        config = json.loads((self.mnt / ".config").read_text())
        self.pid, self.ppid = int(config["Pid"]), int(config.get("PPid") or 0) or None
        return self.pid

    def umount(self) -> float:
        start = time.perf_counter()
        run_checked(["juicefs", "umount", str(self.mnt)], timeout=900)
        for pid in (self.pid, self.ppid):
            if pid is not None and not wait_gone(pid, 120):
                raise RuntimeError(f"juicefs process {pid} still running 120 s after unmount")
        self.pid = self.ppid = None
        return time.perf_counter() - start

    def close(self) -> None:
        """Unmount if mounted; lazily and by killing our juicefs processes if a clean unmount fails."""
        if clean_unmount(self.mnt, self.umount):
            return
        for pid in (self.ppid, self.pid):  # the supervisor first, so it cannot restart the daemon
            kill(pid)
