"""mount(8) integration: ``mount -t fuse.nvfs``, fstab lines, plain ``umount`` and ``allow_other``.

These run mount(8) as root with ``mount_helpers/mount.fuse.nvfs`` installed as
``/sbin/mount.fuse.nvfs`` (the test installs it when it is missing or out of date).
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import Mount, wait_until_dead

pytestmark = pytest.mark.fuse

REPO = Path(__file__).resolve().parent.parent
HELPER = REPO / "mount_helpers" / "mount.fuse.nvfs"
INSTALLED = Path("/sbin/mount.fuse.nvfs")
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def helper_env(tmp_path) -> dict[str, str]:
    """Environment for mount(8): the helper installed, ``$NVFS`` running this checkout's nvfs."""
    if os.geteuid() != 0:
        pytest.skip("mount(8) with a filesystem helper needs root")
    if not INSTALLED.exists() or not filecmp.cmp(HELPER, INSTALLED, shallow=False):
        shutil.copyfile(HELPER, INSTALLED)
    INSTALLED.chmod(0o755)
    wrapper = tmp_path / "nvfs-wrapper"
    wrapper.write_text(f"#!/bin/sh\nexec '{sys.executable}' -m nvfs \"$@\"\n")
    wrapper.chmod(0o755)
    return {**os.environ, "NVFS": str(wrapper)}


@pytest.fixture
def public_mount(mount_factory):
    """A :class:`Mount` below a world-searchable directory (tmp_path is 0700: other users can't get in)."""
    root = Path(tempfile.mkdtemp(prefix="nvfs-public-", dir="/tmp"))
    root.chmod(0o755)
    mount = Mount(root)
    yield mount
    mount.force_cleanup()  # also lazily unmounts a dead FUSE mount (ENOTCONN)
    if not os.path.ismount(mount.mountpoint):
        shutil.rmtree(root)


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)


def _mount_t(mount: Mount, env: dict[str, str], *options: str) -> None:
    """``mount -t fuse.nvfs SOURCE MOUNTPOINT -o log_file=...`` as mount(8) does it."""
    opts = ",".join((f"log_file={mount.log_file}", "log_level=debug", *options))
    result = _run(["mount", "-t", "fuse.nvfs", str(mount.source), str(mount.mountpoint), "-o", opts], env)
    assert result.returncode == 0, f"mount -t fuse.nvfs failed: {result.stderr}\n{mount.log()}"
    assert os.path.ismount(mount.mountpoint)
    assert mount.daemon_pid() > 0


def _plain_umount(mount: Mount, env: dict[str, str]) -> None:
    """``umount MOUNTPOINT`` (not ``nvfs umount``), then wait for the daemon to let go of the store."""
    pid = mount.daemon_pid()
    result = _run(["umount", str(mount.mountpoint)], env)
    assert result.returncode == 0, f"umount failed: {result.stderr}"
    assert not os.path.ismount(mount.mountpoint)
    wait_until_dead(pid, 60, "umount")


def _as_nobody(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run([*NOBODY, *command], capture_output=True, text=True, timeout=60)


def test_mount_t_fuse_nvfs_and_plain_umount(helper_env, mount_factory):
    mount = mount_factory()
    _mount_t(mount, helper_env)
    data = os.urandom(5 << 20) + b"tail"
    (mount.path / "dir").mkdir()
    (mount.path / "dir" / "weights.bin").write_bytes(data)
    assert (mount.path / "dir" / "weights.bin").read_bytes() == data
    with open("/proc/self/mounts") as f:
        entries = [line.split() for line in f if line.split()[1] == str(mount.mountpoint)]
    assert entries and entries[-1][2] == "fuse.nvfs", entries

    _plain_umount(mount, helper_env)
    assert (mount.source / "tree" / "dir" / "weights.bin").is_file()
    _mount_t(mount, helper_env)
    assert (mount.path / "dir" / "weights.bin").read_bytes() == data
    _plain_umount(mount, helper_env)


def test_mount_from_fstab_line(helper_env, mount_factory, tmp_path):
    mount = mount_factory()
    fstab = tmp_path / "fstab"
    options = (f"log_file={mount.log_file},log_level=debug,chunk_size=1M,"
               "noatime,_netdev,nofail,x-systemd.foo=1")
    fstab.write_text(f"# test fstab\n{mount.source}  {mount.mountpoint}  fuse.nvfs  {options}  0  0\n")
    result = _run(["mount", "-T", str(fstab), str(mount.mountpoint)], helper_env)
    assert result.returncode == 0, f"mount -T failed: {result.stderr}\n{mount.log()}"
    assert os.path.ismount(mount.mountpoint)

    data = os.urandom(3 << 20)
    (mount.path / "f.bin").write_bytes(data)
    # chunk_size=1M from the fstab line reached the daemon: 3 chunks, not one of the default size.
    assert os.getxattr(mount.path / "f.bin", "user.nvfs.chunks") == b"3"
    _plain_umount(mount, helper_env)
    result = _run(["mount", "-T", str(fstab), str(mount.mountpoint)], helper_env)
    assert result.returncode == 0, f"mount -T failed: {result.stderr}\n{mount.log()}"
    assert (mount.path / "f.bin").read_bytes() == data
    _plain_umount(mount, helper_env)


def test_allow_other_with_kernel_permission_checks(helper_env, public_mount):
    mount = public_mount
    _mount_t(mount, helper_env, "allow_other")
    public = mount.path / "public.txt"
    secret = mount.path / "secret.txt"
    public.write_text("anyone may read this\n")
    public.chmod(0o644)
    secret.write_text("root only\n")
    secret.chmod(0o600)
    assert os.stat(public).st_uid == 0 and os.stat(secret).st_uid == 0

    result = _as_nobody("cat", str(public))
    assert result.returncode == 0, f"nobody cannot read a 0644 file with allow_other: {result.stderr}"
    assert result.stdout == "anyone may read this\n"
    result = _as_nobody("cat", str(secret))
    assert result.returncode != 0 and "Permission denied" in result.stderr, (
        f"nobody read a 0600 root file: {result}"
    )
    result = _as_nobody("sh", "-c", f"echo overwritten > '{public}'")
    assert result.returncode != 0 and "Permission denied" in result.stderr, result
    result = _as_nobody("touch", str(mount.path / "new.txt"))
    assert result.returncode != 0 and "Permission denied" in result.stderr, result
    assert public.read_text() == "anyone may read this\n"
    assert sorted(os.listdir(mount.path)) == ["public.txt", "secret.txt"]

    # Without allow_other the mount is the mounting user's alone: the 0644 file is out of reach.
    _plain_umount(mount, helper_env)
    _mount_t(mount, helper_env)
    result = _as_nobody("cat", str(public))
    assert result.returncode != 0 and "Permission denied" in result.stderr, result
    _plain_umount(mount, helper_env)
