"""Memory follows the data a file holds, not the size it claims; sizes past max_file_size are EFBIG.

``truncate -s 999999999999999`` by any user of an ``allow_other`` mount grew the daemon by a
slot object per 4 MiB of the claimed size (18 GB) until the host ran out of memory; a
manifest declaring such a size did the same when the file was opened. Each test caps the
daemon's address space first, so that code which still allocates per claimed chunk fails
with ENOMEM or EIO instead of endangering the machine.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from nvfs.testing.procfs import proc_status
from tests.conftest import MIB, Mount, wait_until

pytestmark = pytest.mark.fuse

NOBODY = 65534
ADDRESS_SPACE_ROOM = 2 << 30  # the cap: what the daemon maps now plus this much
GROWTH_BOUND = 64 * MIB  # a petabyte-sized file must not raise the daemon's peak by more
BIG = 15 << 40  # below the default max_file_size (16 TiB): 3.9 million chunks of 4 MiB
HUGE = 999999999999999  # ~909 TiB, the size of the report


@pytest.fixture
def shared_mount(request, backend):
    """A mount with ``allow_other,default_permissions`` where user nobody can reach it.

    pytest's ``tmp_path`` lies under a root-only directory, so the mountpoint is made in /tmp.
    """
    root = Path(tempfile.mkdtemp(prefix="nvfs-sparse-", dir="/tmp"))
    root.chmod(0o755)
    s3 = request.getfixturevalue("seaweed") if backend == "s3" else None
    mount = Mount(root, ("allow_other", "default_permissions"), s3)
    mount.mountpoint.chmod(0o755)
    yield mount
    mount.force_cleanup()
    shutil.rmtree(root, ignore_errors=True)


def _cap_address_space(pid: int) -> int:
    """Limit the daemon's address space; returns its peak resident size so far."""
    mapped = proc_status(pid, "VmSize")
    assert mapped is not None
    limit = mapped + ADDRESS_SPACE_ROOM
    resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))
    peak = proc_status(pid, "VmHWM")
    assert peak is not None
    return peak


def _assert_stayed_small(pid: int, peak_before: int) -> None:
    peak = proc_status(pid, "VmHWM")
    assert peak is not None, "the daemon died"
    assert peak - peak_before <= GROWTH_BOUND, (
        f"the daemon's peak grew by {(peak - peak_before) / MIB:.0f} MiB")


def _as_nobody(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, user=NOBODY, group=NOBODY, capture_output=True, text=True, timeout=60)


def _tail(path: Path, size: int, count: int = 4096) -> bytes:
    with open(path, "rb") as f:
        f.seek(size - count)
        return f.read(count + 1)


def test_huge_truncate_by_another_user_costs_no_memory(shared_mount):
    mount = shared_mount
    mount.mount()
    path = mount.path / "sparse.bin"
    head = os.urandom(MIB + 3)
    path.write_bytes(head)
    os.chown(path, NOBODY, NOBODY)
    pid = mount.daemon_pid()
    peak = _cap_address_space(pid)

    result = _as_nobody("truncate", "-s", str(BIG), str(path))
    assert result.returncode == 0, result.stderr
    assert os.stat(path).st_size == BIG
    assert _tail(path, BIG) == bytes(4096)
    with open(path, "rb") as f:
        assert f.read(len(head) + 10) == head + bytes(10)
    _assert_stayed_small(pid, peak)

    wait_until(lambda: json.loads(mount.read_object("tree/sparse.bin"))["size"] == BIG,
               "the new size is committed", timeout=30)
    manifest = json.loads(mount.read_object("tree/sparse.bin"))
    assert len(manifest["chunks"]) == 1, "the manifest lists the trailing holes"
    mount.remount()
    pid = mount.daemon_pid()
    peak = _cap_address_space(pid)
    assert os.stat(path).st_size == BIG
    assert _tail(path, BIG) == bytes(4096)
    _assert_stayed_small(pid, peak)


def test_a_size_past_max_file_size_is_efbig(shared_mount):
    mount = shared_mount
    mount.mount()
    path = mount.path / "sparse.bin"
    path.write_bytes(b"x" * 100)
    os.chown(path, NOBODY, NOBODY)
    pid = mount.daemon_pid()
    peak = _cap_address_space(pid)

    result = _as_nobody("truncate", "-s", str(HUGE), str(path))
    assert result.returncode != 0 and "File too large" in result.stderr, result.stderr
    # A new file is written past the page cache (direct_io), so write(2) itself answers.
    fd = os.open(mount.path / "new.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with pytest.raises(OSError) as failure:
            os.pwrite(fd, b"y", HUGE)
        assert failure.value.errno == errno.EFBIG
    finally:
        os.close(fd)
    assert os.stat(mount.path / "new.bin").st_size == 0
    assert os.stat(path).st_size == 100
    assert path.read_bytes() == b"x" * 100
    _assert_stayed_small(pid, peak)


def test_a_manifest_declaring_a_huge_size_opens_without_memory(shared_mount):
    mount = shared_mount
    mount.mount()
    path = mount.path / "claimed.bin"
    head = os.urandom(5 * MIB)
    path.write_bytes(head)
    wait_until(lambda: "tree/claimed.bin" in mount.keys("tree/"), "the file is committed", timeout=30)
    mount.umount()
    manifest = json.loads(mount.read_object("tree/claimed.bin"))
    manifest["size"] = HUGE  # crafted: more than max_file_size, two chunks stored
    mount.write_object("tree/claimed.bin", json.dumps(manifest).encode())
    mount.mount()
    pid = mount.daemon_pid()
    peak = _cap_address_space(pid)

    assert os.stat(path).st_size == HUGE
    with open(path, "rb") as f:
        assert f.read(len(head) + 7) == head + bytes(7)
    assert _tail(path, HUGE) == bytes(4096)
    _assert_stayed_small(pid, peak)
