"""Write processes (``-o write_procs=N``, the default 1 on directory stores coded by the CPU
engine): chunks hashed, coded and written by child processes from buffers shared with the daemon.

Every other test of a directory store writes through them too; here: that they are there
only where they can serve, that a killed one costs a warning and nothing else (the daemon
stores the chunk itself and a new process takes over), and the shared buffers' bookkeeping.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading

import blake3
import numpy as np
import pytest

from nvfs.backend.directory import DirectoryBackend
from nvfs.codec import CpuEngine
from nvfs.store import ChunkProcessPool, SharedChunkBuffers, Store
from tests.conftest import MIB, checkpoint_like, fetch_children, wait_until, wait_until_dead

pytestmark = pytest.mark.fuse

CPU = ("engine=cpu",)  # write processes code with the CPU engine only


@pytest.mark.s3
def test_a_directory_store_has_one_write_process_and_s3_none(mount_factory):
    """Where the GPU engine codes (on the GPU machine, by default) the daemon writes chunks itself."""
    local = mount_factory("local", options=CPU)
    local.mount()
    assert len(fetch_children(local.daemon_pid())) == 1
    assert "1 write processes of" in local.log()
    off = mount_factory("off", options=(*CPU, "write_procs=0"))
    off.mount()
    assert fetch_children(off.daemon_pid()) == []
    remote = mount_factory("remote", options=(*CPU, "fetch_procs=0"), backend="s3")
    remote.mount()
    assert fetch_children(remote.daemon_pid()) == []


def test_files_written_through_a_write_process_read_back_exact(mount_factory):
    mount = mount_factory(options=(*CPU, "chunk_size=1M"))
    mount.mount()
    files = {f"f{n}.bin": checkpoint_like(7 * MIB + 4096 * n + 17, n) for n in range(3)}
    for name, data in files.items():
        (mount.path / name).write_bytes(data)
    mount.remount()
    for name, data in files.items():
        assert (mount.path / name).read_bytes() == data
    assert "storing it in the daemon" not in mount.log()
    distinct = {blake3.blake3(data[start : start + MIB]).hexdigest()
                for data in files.values() for start in range(0, len(data), MIB)}
    assert {key.rsplit("/", 1)[1] for key in mount.keys("chunks/")} == distinct


@pytest.mark.parametrize("when", ["idle", "mid-write"])
def test_a_killed_write_process_costs_a_warning_not_data(mount_factory, when):
    """The chunk it had, or the next one, is handed to the process started in its place."""
    mount = mount_factory(options=(*CPU, "chunk_size=1M"))
    mount.mount()
    data = checkpoint_like(24 * MIB, 5)
    (before,) = fetch_children(mount.daemon_pid())
    if when == "idle":
        os.kill(before, signal.SIGKILL)
        wait_until_dead(before, 10, "SIGKILL")
        (mount.path / "x.bin").write_bytes(data)
    else:
        with open(mount.path / "x.bin", "wb") as f:
            f.write(data[: 8 * MIB])
            killer = threading.Thread(target=os.kill, args=(before, signal.SIGKILL))
            killer.start()
            f.write(data[8 * MIB :])
            killer.join()
    mount.remount()
    assert (mount.path / "x.bin").read_bytes() == data
    log = mount.log()
    assert "starting another" in log
    assert "handing it over again" in log or "storing it in the daemon" in log  # event loop or thread
    after = fetch_children(mount.daemon_pid())
    assert len(after) == 1 and before not in after


def test_content_collected_and_written_again_is_stored_again(mount_factory):
    """A write process remembers what it stored, to spare coding it twice; once a collection has
    deleted those chunks, the same content written again must be stored again, not assumed."""
    mount = mount_factory(options=(*CPU, "chunk_size=1M"))
    mount.mount()
    data = checkpoint_like(6 * MIB, 7)
    ids = {blake3.blake3(data[start : start + MIB]).hexdigest() for start in range(0, len(data), MIB)}
    chunks = mount.source / "chunks"
    (mount.path / "a.bin").write_bytes(data)
    (mount.path / "a.bin").unlink()
    wait_until(lambda: not any(path.is_file() for path in chunks.rglob("*")),
               "the unlinked file's chunks are collected")
    (mount.path / "b.bin").write_bytes(data)
    mount.remount()
    assert (mount.path / "b.bin").read_bytes() == data
    assert {key.rsplit("/", 1)[1] for key in mount.keys("chunks/")} == ids


def test_a_hung_write_process_is_replaced_after_write_timeout(mount_factory):
    """A stopped (SIGSTOP) process answers nothing: after ``write_timeout`` it is killed, its
    chunks are handed over again and a new process takes over; the writer only waits."""
    mount = mount_factory(options=(*CPU, "chunk_size=1M", "write_timeout=2"))
    mount.mount()
    data = checkpoint_like(12 * MIB, 6)
    (mount.path / "first.bin").write_bytes(data[: 8 * MIB])  # every lane has served: the process is up
    (before,) = fetch_children(mount.daemon_pid())
    os.kill(before, signal.SIGSTOP)
    try:
        (mount.path / "x.bin").write_bytes(data)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(before, signal.SIGCONT)
    wait_until_dead(before, 10, "the daemon's kill")
    mount.remount()
    assert (mount.path / "x.bin").read_bytes() == data
    log = mount.log()
    assert "did not answer in 2 s: handing it over again" in log
    assert "starting another" in log
    after = fetch_children(mount.daemon_pid())
    assert len(after) == 1 and before not in after


def test_shared_buffers_come_back_when_the_last_view_is_gone():
    buffers = SharedChunkBuffers(2, MIB)
    first, second = buffers.take(), buffers.take()
    assert first is not None and second is not None and buffers.take() is None
    view = memoryview(first)[10:20]
    del first
    gc.collect()
    assert buffers.in_use() == 2, "a view still holds the first buffer"
    del view
    gc.collect()
    assert buffers.in_use() == 1
    third = buffers.take()
    assert third is not None and buffers.take() is None


def test_shared_buffers_locate_only_what_lies_inside_one_buffer():
    buffers = SharedChunkBuffers(2, MIB)
    first, second = buffers.take(), buffers.take()
    base = min(first.ctypes.data, second.ctypes.data)
    lower = first if first.ctypes.data == base else second
    assert buffers.offset_of(memoryview(lower)[5:100]) == 5
    assert buffers.offset_of(memoryview(np.empty(100, dtype=np.uint8))) is None
    assert buffers.offset_of(memoryview(b"")) is None
    whole = np.frombuffer(buffers._map, dtype=np.uint8)  # both buffers: spans their boundary
    assert buffers.offset_of(memoryview(whole)[MIB - 10 : MIB + 10]) is None


def test_releasing_free_pages_keeps_the_bytes_of_buffers_in_use():
    buffers = SharedChunkBuffers(3, MIB)
    kept = buffers.take()
    kept[:] = 7
    freed = buffers.take()
    freed[:] = 9
    del freed
    gc.collect()
    buffers.release_free_pages()
    assert (kept == 7).all()
    assert all((buffer == 0).all() for buffer in (buffers.take(), buffers.take()))  # holes read as zeros


def test_a_write_pool_that_cannot_start_leaves_the_chunks_to_the_daemon(tmp_path, monkeypatch, caplog):
    """A process that dies before it is ready turns the pool off, once: from then on chunks are
    stored in the daemon without a warning each, and no shared buffer is handed out."""
    monkeypatch.setattr(sys, "executable", "/bin/false")
    store = Store.open(DirectoryBackend(str(tmp_path)), CpuEngine(), write_pool=ChunkProcessPool(1, 2),
                       write_buffers=SharedChunkBuffers(4, MIB))
    try:
        shared = store.chunk_buffer(MIB)  # before anyone knows the process is gone
        assert shared is not None
        for seed in range(3):
            data = checkpoint_like(4 * MIB, seed)[:MIB]
            buffer = shared if seed == 0 else np.empty(MIB, dtype=np.uint8)
            buffer[:] = np.frombuffer(data, dtype=np.uint8)
            ref = store.start_put(memoryview(buffer)).finish()
            assert bytes(store.start_get(ref).finish()) == data
        assert store.chunk_buffer(MIB) is None
    finally:
        store.close()
    assert caplog.text.count("exited with status 1 before it was ready") == 1
    assert caplog.text.count("storing it in the daemon") == 1  # the chunk that found out
