"""Fetch processes (``-o fetch_procs=N``, nvfs/store/chunk_processes/) on a real S3 mount.

Reads go through child processes that GET, decode and verify chunks: the bytes must come
back exact, a damaged or missing chunk must still be EIO naming the file and chunk, and a
child that dies must cost nothing but a warning (its chunks are read in the daemon and a
new child takes over).
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import signal
import sys
import time

import pytest

from nvfs.backend import BackendError
from nvfs.backend.object_get import GetterSettings, ObjectGet
from nvfs.store.chunk_processes import ChunkMaps, ChunkProcessFailed, ChunkProcessPool
from tests.conftest import MIB, checkpoint_like, drop_cache, fetch_children, wait_until_dead

pytestmark = [pytest.mark.fuse, pytest.mark.s3]


@pytest.fixture
def stored(mount_factory):
    """An S3 store with two files of 1 MiB chunks, mounted with two fetch processes, page cache cold."""
    mount = mount_factory(options=("chunk_size=1M", "fetch_procs=2", "threads=4"), backend="s3")
    mount.mount()
    files = {"a.bin": checkpoint_like(9 * MIB + 123, 1), "b.bin": checkpoint_like(6 * MIB, 2)}
    for name, data in files.items():
        (mount.path / name).write_bytes(data)
    mount.remount()
    for name in files:
        drop_cache(mount.path / name)
    return mount, files


def test_reads_through_fetch_processes_are_exact(stored):
    mount, files = stored
    for name, data in files.items():
        assert (mount.path / name).read_bytes() == data
    children = fetch_children(mount.daemon_pid())
    assert len(children) == 2, f"expected 2 fetch processes, found {children}"
    assert "chunk processes ready after" in mount.log()  # before the mount returned
    assert "reading it in the daemon" not in mount.log()
    mount.umount()
    for pid in children:
        wait_until_dead(pid, 10, "unmount")


def test_fetch_processes_exit_when_the_daemon_is_killed(stored):
    """A child reads EOF on its lanes once the daemon is gone: nothing is left running."""
    mount, files = stored
    with open(mount.path / "a.bin", "rb") as f:
        assert f.read(MIB) == files["a.bin"][:MIB]
    daemon = mount.daemon_pid()
    children = fetch_children(daemon)
    assert children
    os.kill(daemon, signal.SIGKILL)
    wait_until_dead(daemon, 10, "SIGKILL")
    for pid in children:
        wait_until_dead(pid, 10, "the daemon was killed")


def _chunk_ids(mount, name: str) -> list[str]:
    return [ref[0] for ref in json.loads(mount.read_object(f"tree/{name}"))["chunks"]]


def test_damaged_and_missing_chunks_are_eio_naming_file_and_chunk(stored):
    mount, files = stored
    ids = _chunk_ids(mount, "a.bin")
    key = f"chunks/{ids[2][:2]}/{ids[2]}"
    blob = bytearray(mount.read_object(key))
    blob[-100] ^= 0x40
    mount.write_object(key, bytes(blob))
    mount.delete_object(f"chunks/{ids[5][:2]}/{ids[5]}")
    with open(mount.path / "a.bin", "rb") as f:
        assert f.read(2 * MIB) == files["a.bin"][: 2 * MIB]  # the chunks before are fine
        for index in (2, 5):
            f.seek(index * MIB)
            with pytest.raises(OSError) as failure:
                f.read(MIB)
            assert failure.value.errno == errno.EIO
            assert f"/a.bin: chunk {index} ({ids[index]})" in mount.log()
    assert "chunk object is missing" in mount.log()
    assert "failed verification" in mount.log()
    assert (mount.path / "b.bin").read_bytes() == files["b.bin"]


@pytest.mark.parametrize("first_read", [True, False], ids=["after-a-read", "at-once"])
def test_killed_fetch_processes_are_replaced(stored, first_read):
    """Killed after serving or before their first request, children come back."""
    mount, files = stored
    if first_read:
        with open(mount.path / "a.bin", "rb") as f:
            assert f.read(MIB) == files["a.bin"][:MIB]
    daemon = mount.daemon_pid()
    before = fetch_children(daemon)
    assert len(before) == 2, f"expected 2 fetch processes, found {before}"
    for pid in before:
        os.kill(pid, signal.SIGKILL)
    # Reads of chunks not yet cached: the first meets a dead child and is read in the daemon.
    assert (mount.path / "b.bin").read_bytes() == files["b.bin"]
    assert (mount.path / "a.bin").read_bytes() == files["a.bin"]
    assert "starting another" in mount.log()
    assert "itself from now on" not in mount.log()
    after = fetch_children(daemon)
    assert len(after) == 2 and not set(after) & set(before), f"children before {before}, after {after}"


def _unreachable_get() -> ObjectGet:
    return ObjectGet(GetterSettings("http://127.0.0.1:9", 1, 1, 1), "chunks/ab/x", "/b/chunks/ab/x")


def test_a_ready_pool_takes_requests_from_the_event_loop_on_every_lane():
    """Once wait_ready says so, send_get finds every lane ready: none waits in a thread."""
    pool = ChunkProcessPool(processes=2, calls=4)
    try:
        pool.start()
        assert pool.wait_ready(60)
        sent = [pool.send_get(_unreachable_get(), "ab" * 32, MIB, "blake3") for _ in range(4)]
        assert all(request is not None for request in sent)
        assert pool.send_get(_unreachable_get(), "ab" * 32, MIB, "blake3") is None  # all busy
        for request in sent:
            with pytest.raises(BackendError):
                pool.receive_get(request)
    finally:
        pool.close()


def test_waiting_for_a_pool_whose_processes_exit_ends_at_once(monkeypatch):
    """A child that exits before it is ready ends the wait: the mount is not held for the timeout."""
    monkeypatch.setattr(sys, "executable", "/bin/false")
    pool = ChunkProcessPool(processes=2, calls=4)
    try:
        pool.start()
        started = time.monotonic()
        assert not pool.wait_ready(60)
        assert time.monotonic() - started < 30
    finally:
        pool.close()


def test_a_pool_whose_processes_cannot_start_turns_off(monkeypatch, caplog):
    """A child that dies before serving anything is not restarted: every read would pay for it."""
    monkeypatch.setattr(sys, "executable", "/bin/false")
    pool = ChunkProcessPool(processes=1, calls=2)
    request = _unreachable_get()
    try:
        with pytest.raises(ChunkProcessFailed, match="did not start|before it was ready"):
            pool.get(request, "ab" * 32, MIB, "blake3")
        with pytest.raises(ChunkProcessFailed, match="off"):
            pool.get(request, "ab" * 32, MIB, "blake3")
    finally:
        pool.close()
    assert "exited with status 1 before it was ready" in caplog.text


def test_no_fetch_processes_with_a_disk_cache(mount_factory, tmp_path):
    """Objects kept in ``cache_dir`` are fetched in the daemon, so no child is started for them."""
    (tmp_path / "cache").mkdir()
    mount = mount_factory(options=("fetch_procs=2", f"cache_dir={tmp_path / 'cache'}"), backend="s3")
    mount.mount()
    data = checkpoint_like(5 * MIB, 3)
    (mount.path / "c.bin").write_bytes(data)
    mount.remount()
    drop_cache(mount.path / "c.bin")
    assert (mount.path / "c.bin").read_bytes() == data
    assert fetch_children(mount.daemon_pid()) == []


def _memfd_with(data: bytes) -> int:
    memfd = os.memfd_create("test-chunk")
    os.write(memfd, data)
    return memfd


def test_chunks_are_mapped_up_to_the_limit_and_copied_past_it():
    """Each mapped chunk holds a descriptor: past the limit the daemon reads the memfd instead."""
    data = checkpoint_like(MIB, 4)
    maps = ChunkMaps()
    assert maps.limit >= 256, "the daemon's open-file limit leaves no room for mapped chunks"
    maps.limit = 2
    memfd = _memfd_with(data)
    try:
        first, second = maps.chunk_in(memfd, len(data)), maps.chunk_in(memfd, len(data))
        third = maps.chunk_in(memfd, len(data))
        assert [isinstance(view.obj, mmap.mmap) for view in (first, second, third)] == [True, True, False]
        assert all(bytes(view) == data for view in (first, second, third))
        assert maps.mapped == 2
        part = first[10:20]  # a view of the map keeps it mapped
        del first
        assert maps.mapped == 2
        del part
        assert maps.mapped == 1
        assert isinstance(maps.chunk_in(memfd, len(data)).obj, mmap.mmap)
    finally:
        os.close(memfd)


def test_a_chunk_that_cannot_be_mapped_is_copied(monkeypatch):
    """Out of memory maps (``vm.max_map_count``), the daemon reads the child's memfd instead."""
    data = checkpoint_like(MIB, 5)
    maps = ChunkMaps()
    memfd = _memfd_with(data)

    def no_more_maps(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", no_more_maps)
    try:
        copied = maps.chunk_in(memfd, len(data))
        assert bytes(copied) == data and maps.mapped == 0
    finally:
        os.close(memfd)
