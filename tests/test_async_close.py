"""async_close: close returns before the file is committed; fsync and unmount still wait for it."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal

import pytest

from tests.conftest import Mount

pytestmark = pytest.mark.fuse

MIB = 1 << 20
CLOSE_DEADLINE = 20.0  # seconds; a synchronous close would wait for the paused server instead


def _signal_server(server, sig: signal.Signals) -> None:
    os.killpg(os.getpgid(server.pid), sig)


def _committed(path) -> bytes:
    return os.getxattr(path, "user.nvfs.committed")


@pytest.mark.s3
def test_close_returns_while_uploads_are_stuck_and_fsync_waits(tmp_path, own_server, request):
    (tmp_path / "m").mkdir()
    # A long listing TTL: nothing but the commit itself needs the (paused) server.
    mount = Mount(tmp_path / "m", ("async_close", "metadata_ttl=3600"), s3=own_server)
    request.addfinalizer(mount.force_cleanup)
    mount.mount()
    path = mount.path / "ckpt.bin"
    old = os.urandom(3 * MIB)
    path.write_bytes(old)
    with open(path, "rb") as f:
        os.fsync(f.fileno())  # the old version is committed
    assert _committed(path) == b"yes"

    new = os.urandom(10 * MIB + 7)
    writer = concurrent.futures.ThreadPoolExecutor(1)
    _signal_server(own_server, signal.SIGSTOP)
    request.addfinalizer(lambda: _signal_server(own_server, signal.SIGCONT))
    try:
        writer.submit(path.write_bytes, new).result(timeout=CLOSE_DEADLINE)  # open, write, close
        assert _committed(path) == b"no"  # the manifest cannot have reached the paused server
        assert path.read_bytes() == new  # this mount serves the new contents from memory
    finally:
        _signal_server(own_server, signal.SIGCONT)
        writer.shutdown()

    with open(path, "rb") as f:
        os.fsync(f.fileno())  # returns once the new version is durable in S3
    assert _committed(path) == b"yes"
    assert json.loads(mount.read_object("tree/ckpt.bin"))["size"] == len(new)
    mount.remount()
    assert path.read_bytes() == new


def test_unmount_commits_every_file_closed_asynchronously(mount_factory, backend):
    mount = mount_factory(backend=backend, options=("async_close",))
    mount.mount()
    files = {f"f{index}.bin": os.urandom(index * MIB + index) for index in range(1, 6)}
    for name, data in files.items():
        (mount.path / name).write_bytes(data)
    mount.umount()
    assert sorted(key.removeprefix("tree/") for key in mount.keys("tree/") if "#" not in key) == sorted(files)
    mount.mount()
    for name, data in files.items():
        assert (mount.path / name).read_bytes() == data
