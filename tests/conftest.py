"""Fixtures that mount nvfs for real: a backing directory, a mountpoint and the daemon."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NVFS = [sys.executable, "-m", "nvfs"]


def nvfs(*args: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the ``nvfs`` command line; returns the finished process (text output)."""
    return subprocess.run([*NVFS, *args], capture_output=True, text=True, timeout=timeout, check=check)


def _fuse_available() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (apt-get install fuse3)"
    return None


class Mount:
    """One nvfs mount of ``source`` on ``mountpoint``, logging to ``log_file``."""

    def __init__(self, root: Path, options: tuple[str, ...] = ()) -> None:
        self.source = root / "store"
        self.mountpoint = root / "mnt"
        self.log_file = root / "nvfs.log"
        self.options = options
        self.source.mkdir(exist_ok=True)
        self.mountpoint.mkdir(exist_ok=True)

    @property
    def path(self) -> Path:
        return self.mountpoint

    def mount(self, *extra: str) -> None:
        options = ",".join((f"log_file={self.log_file}", "log_level=debug", *self.options, *extra))
        result = nvfs("mount", str(self.source), str(self.mountpoint), "-o", options)
        assert result.returncode == 0, f"mount failed: {result.stderr}\n{self.log()}"
        assert os.path.ismount(self.mountpoint)

    def umount(self) -> None:
        result = nvfs("umount", str(self.mountpoint))
        assert result.returncode == 0, f"umount failed: {result.stderr}\n{self.log()}"
        assert not os.path.ismount(self.mountpoint)

    def remount(self) -> None:
        self.umount()
        self.mount()

    def daemon_pid(self) -> int:
        return int(os.getxattr(self.mountpoint, "user.nvfs.pid"))

    def log(self) -> str:
        return self.log_file.read_text() if self.log_file.exists() else ""

    def is_in_mount_table(self) -> bool:
        """Mounted, even if dead: ``os.path.ismount`` says no once the daemon is gone (ENOTCONN)."""
        with open("/proc/self/mountinfo") as table:
            return any(line.split()[4] == str(self.mountpoint) for line in table)

    def force_cleanup(self) -> None:
        """Tear down whatever a failed test left behind, so later tests get a clean slate."""
        if not self.is_in_mount_table():
            return
        if not os.path.ismount(self.mountpoint) or nvfs("umount", str(self.mountpoint)).returncode != 0:
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], check=False)


@pytest.fixture
def mount_factory(tmp_path):
    """Make (unmounted) :class:`Mount` objects under ``tmp_path``; all are torn down at the end."""
    made: list[Mount] = []
    reason = _fuse_available()
    if reason:
        pytest.skip(reason)

    def make(name: str = "m", options: tuple[str, ...] = ()) -> Mount:
        root = tmp_path / name
        root.mkdir(exist_ok=True)
        mount = Mount(root, options)
        made.append(mount)
        return mount

    yield make
    for mount in made:
        mount.force_cleanup()


@pytest.fixture
def mounted(mount_factory) -> Mount:
    """A fresh store, mounted."""
    mount = mount_factory()
    mount.mount()
    return mount
