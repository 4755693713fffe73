"""The store and the disk cache are private, and a full store says so (ENOSPC).

Objects are 0600 and directories 0700 whatever the daemon's umask, so a user who may not
read a file through the mount cannot read its chunks in the backing directory either. A
full backing filesystem fails a chunk or manifest write with ENOSPC, not EIO, and leaves
no temporary file behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest

from nvfs.backend.directory import DirectoryBackend
from nvfs.codec import CpuEngine
from nvfs.store import ChunkProcessPool, Manifest, SharedChunkBuffers, Store, StoreUnavailable
from tests.conftest import MIB, drop_cache

pytestmark = pytest.mark.fuse

TMPFS_SIZE = 6 * MIB  # room for one incompressible 4 MiB chunk, not two


@contextlib.contextmanager
def _umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    """Permission bits of everything below ``root`` (not ``root`` itself), by relative path."""
    return {str(path.relative_to(root)): stat.S_IMODE(path.lstat().st_mode) for path in root.rglob("*")}


def _not_private(modes: dict[str, int], root: Path) -> dict[str, str]:
    wrong = {}
    for name, mode in modes.items():
        expected = 0o700 if (root / name).is_dir() else 0o600
        if mode != expected:
            wrong[name] = oct(mode)
    return wrong


@pytest.mark.parametrize("mask", [0o000, 0o022], ids=["umask000", "umask022"])
def test_store_and_cache_objects_are_private(mount_factory, tmp_path, mask):
    cache = tmp_path / "cache"
    cache.mkdir()
    mount = mount_factory(options=(f"cache_dir={cache}", "engine=cpu"))
    with _umask(mask):
        mount.mount()
        (mount.path / "a" / "b").mkdir(parents=True)
        (mount.path / "a" / "b" / "ckpt.bin").write_bytes(os.urandom(5 * MIB))  # through a write process
        (mount.path / "a" / "link").symlink_to("b")
        (mount.path / "a" / "b" / "ckpt.bin").rename(mount.path / "a" / "moved.bin")
        mount.remount()
        drop_cache(mount.path / "a" / "moved.bin")
        assert len((mount.path / "a" / "moved.bin").read_bytes()) == 5 * MIB  # fills the cache
        mount.umount()
    store_modes = _modes(mount.source)
    assert "nvfs.json" in store_modes and any(name.startswith("chunks/") for name in store_modes)
    assert _not_private(store_modes, mount.source) == {}
    cache_modes = _modes(cache)
    assert any(name.startswith("chunks/") and (cache / name).is_file() for name in cache_modes)
    assert _not_private(cache_modes, cache) == {}


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of TMPFS_SIZE bytes (root only), unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path = tmp_path / "small"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs", str(path)],
                   check=True, timeout=30)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True, timeout=30)


def _fill(path: Path) -> None:
    """Take every free byte of the filesystem at ``path``."""
    block = bytes(4096)
    with open(path / "filler", "ab", buffering=0) as f, contextlib.suppress(OSError):
        while f.write(block):
            pass


def _leftovers(store: Path) -> list[str]:
    tmp = store / ".tmp"
    return sorted(os.listdir(tmp)) if tmp.exists() else []


def _open_store(root: Path, write_processes: bool) -> Store:
    backend = DirectoryBackend(str(root))
    if not write_processes:
        return Store.open(backend, CpuEngine())
    store = Store.open(backend, CpuEngine(), write_pool=ChunkProcessPool(1, 2),
                       write_buffers=SharedChunkBuffers(2, 4 * MIB))
    assert store.wait_for_processes(60), "the write process did not start"
    return store


@pytest.mark.parametrize("write_processes", [False, True], ids=["daemon", "write_process"])
def test_a_full_store_fails_chunk_writes_with_enospc_and_leaves_no_temporary_file(small_fs, write_processes):
    store_root = small_fs / "store"
    store_root.mkdir()
    store = _open_store(store_root, write_processes)
    try:
        with pytest.raises(StoreUnavailable) as failure:
            for _ in range(4):  # the second chunk cannot fit
                buffer = store.chunk_buffer(4 * MIB)
                if write_processes:
                    assert buffer is not None
                else:
                    buffer = np.empty(4 * MIB, dtype=np.uint8)
                buffer[:] = np.frombuffer(os.urandom(4 * MIB), dtype=np.uint8)
                store.start_put(memoryview(buffer)).finish()
                del buffer
        assert failure.value.errno == errno.ENOSPC
        assert _leftovers(store_root) == []
    finally:
        store.close()


def test_a_full_store_fails_manifest_writes_with_enospc(small_fs):
    store_root = small_fs / "store"
    store_root.mkdir()
    store = Store.open(DirectoryBackend(str(store_root)), CpuEngine())
    try:
        _fill(small_fs)
        meta = Manifest("file", stat.S_IFREG | 0o644, 0, 0, 1, 1)
        with pytest.raises(StoreUnavailable) as failure:
            store.write_entry(("f",), meta)
        assert failure.value.errno == errno.ENOSPC
        assert _leftovers(store_root) == []
        (small_fs / "filler").unlink()
        store.write_entry(("f",), meta)  # room again: the same write succeeds
        assert store.list_dir(()) == {"f": meta}
    finally:
        store.close()
