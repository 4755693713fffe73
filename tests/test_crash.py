"""Crash consistency: ``kill -9`` of the daemon in the middle of a large write.

A file's contents become durable at close/fsync, with the manifest written last; so a
crash before that leaves the store exactly as it was: a new file does not exist, an
overwritten file keeps its old contents (never a mix), and the store can be mounted again.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import wait_until_dead

pytestmark = pytest.mark.fuse

MIB = 1 << 20
TOTAL_MIB = 256  # what the writer would write if nothing stopped it
KILL_AT_MIB = 50  # when the daemon is killed

# Writes TOTAL MiB of random data in 1 MiB pieces to PATH (opened as MODE says) and reports
# on stdout how many MiB each write(2) has returned for, then "done" after close(2).
WRITER = r"""
import os, sys
path, mode, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
flags = {"new": os.O_CREAT | os.O_EXCL, "truncate": os.O_TRUNC, "inplace": 0}[mode]
fd = os.open(path, os.O_WRONLY | flags, 0o644)
for written in range(1, total + 1):
    view = memoryview(os.urandom(1 << 20))
    while view:
        view = view[os.write(fd, view):]
    print(written, flush=True)
os.close(fd)
print("done", flush=True)
"""


def _start_writer(path: Path, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), mode, str(TOTAL_MIB)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for_progress(writer: subprocess.Popen, mib: int, timeout: float = 60) -> None:
    """Block until the writer reports that ``mib`` MiB have been written."""
    assert writer.stdout is not None
    fd = writer.stdout.fileno()
    deadline = time.monotonic() + timeout
    pending = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"the writer did not reach {mib} MiB within {timeout:.0f}s")
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            continue
        data = os.read(fd, 4096)
        if not data:
            writer.wait(timeout=10)
            stderr = writer.stderr.read().decode(errors="replace") if writer.stderr else ""
            pytest.fail(f"the writer exited ({writer.returncode}) before {mib} MiB: {stderr}")
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip() == b"done":
                pytest.fail("the writer finished before the daemon could be killed")
            if int(line) >= mib:
                return


def _crash_during_write(mount, path: Path, mode: str) -> None:
    """Start a large write to ``path``, kill -9 the daemon mid-way, clean up the dead mount."""
    pid = mount.daemon_pid()
    writer = _start_writer(path, mode)
    try:
        _wait_for_progress(writer, KILL_AT_MIB)
        os.kill(pid, signal.SIGKILL)
        wait_until_dead(pid, 30, "SIGKILL")
        # The connection is aborted: the writer's next write (or its close) fails.
        out, err = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert writer.returncode != 0, "the writer did not notice that the daemon died"
    assert b"done" not in out.split(), "the write completed although the daemon was killed mid-way"
    mount.lazy_unmount()
    assert not os.path.ismount(mount.mountpoint)


def _manifests(store: Path) -> dict[str, dict]:
    tree = store / "tree"
    return {
        str(path.relative_to(tree)): json.loads(path.read_bytes())
        for path in tree.rglob("*")
        if path.is_file() and path.name != "#dir"
    }


def _assert_new_writes_work(mount) -> None:
    """After the crash the store is usable: write, close, read back, and it survives a remount."""
    data = os.urandom(3 * MIB + 12345)
    after = mount.path / "after-crash.bin"
    after.write_bytes(data)
    assert after.read_bytes() == data
    mount.remount()
    assert after.read_bytes() == data


def test_kill_during_write_of_new_file(mount_factory):
    mount = mount_factory()
    mount.mount()
    (mount.path / "keep.txt").write_bytes(b"committed before the crash\n")
    target = mount.path / "big.bin"

    _crash_during_write(mount, target, "new")

    # Nothing of the new file was committed, so nothing of it may show up; the store
    # must not be left locked by the dead daemon.
    assert "big.bin" not in _manifests(mount.source)
    mount.mount()
    assert sorted(os.listdir(mount.path)) == ["keep.txt"]
    assert not target.exists()
    assert (mount.path / "keep.txt").read_bytes() == b"committed before the crash\n"
    _assert_new_writes_work(mount)

    # The chunks the dead daemon stored for big.bin are orphans; the next daemon's garbage
    # collection removes them, leaving only chunks that a manifest names.
    mount.umount()
    referenced = {ref[0] for manifest in _manifests(mount.source).values()
                  for ref in manifest.get("chunks", []) if ref}
    stored = {path.name for path in (mount.source / "chunks").rglob("*") if path.is_file()}
    assert stored == referenced, f"{len(stored - referenced)} orphaned chunk objects were left behind"


@pytest.mark.parametrize("mode", ["truncate", "inplace"])
def test_kill_during_overwrite_keeps_old_contents(mount_factory, mode):
    mount = mount_factory()
    mount.mount()
    target = mount.path / "model.bin"
    v1 = os.urandom(18 * MIB + 4321)  # several chunks and a partial last one
    target.write_bytes(v1)
    target.chmod(0o640)
    manifest_v1 = _manifests(mount.source)["model.bin"]

    _crash_during_write(mount, target, mode)

    # The manifest of V1 is what the store holds, byte for byte the same.
    assert _manifests(mount.source)["model.bin"] == manifest_v1
    mount.mount()
    assert os.stat(target).st_size == len(v1)
    assert os.stat(target).st_mode & 0o777 == 0o640
    data = target.read_bytes()
    assert hashlib.sha256(data).hexdigest() == hashlib.sha256(v1).hexdigest(), (
        "after the crash the file is neither its old contents nor absent: a mix of V1 and V2"
    )
    _assert_new_writes_work(mount)
    assert target.read_bytes() == v1
    mount.umount()
