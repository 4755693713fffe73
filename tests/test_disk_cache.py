"""cache_dir: chunk objects kept on local disk serve reads across remounts and mounts, within a bound."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import Mount, drop_cache, wait_until

pytestmark = [pytest.mark.fuse, pytest.mark.s3]

MIB = 1 << 20


def _cached(cache: Path) -> dict[str, Path]:
    """Chunk id -> file of every object in the cache directory."""
    return {path.name: path for path in (cache / "chunks").rglob("*") if path.is_file()}


def _chunk_ids(mount: Mount, name: str) -> list[str]:
    manifest = json.loads(mount.read_object(f"tree/{name}"))
    return [ref[0] for ref in manifest["chunks"] if ref is not None]


def _cache_dir(tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    cache.mkdir()
    return cache


def _delete_chunks_from_store(mount: Mount) -> None:
    chunks = mount.keys("chunks/")
    assert chunks
    for key in chunks:
        mount.delete_object(key)


def test_cache_serves_reads_after_a_remount_when_the_store_lost_the_chunks(mount_factory, tmp_path):
    cache = _cache_dir(tmp_path)
    mount = mount_factory(backend="s3", options=(f"cache_dir={cache}",))
    mount.mount()
    data = os.urandom(10 * MIB + 5)
    (mount.path / "ckpt.bin").write_bytes(data)
    mount.remount()
    assert (mount.path / "ckpt.bin").read_bytes() == data  # fetched from S3, and cached
    ids = _chunk_ids(mount, "ckpt.bin")
    assert sorted(_cached(cache)) == sorted(ids)
    for cid, path in _cached(cache).items():  # stored form: byte for byte the S3 object
        assert path.read_bytes() == mount.read_object(f"chunks/{cid[:2]}/{cid}")

    mount.umount()
    _delete_chunks_from_store(mount)
    mount.mount()
    assert (mount.path / "ckpt.bin").read_bytes() == data


def test_two_mounts_share_one_cache_dir(mount_factory, tmp_path):
    """B's reads fill the cache; A, mounted at the same time, then reads from it."""
    cache = _cache_dir(tmp_path)
    options = (f"cache_dir={cache}", "metadata_ttl=0")
    a = mount_factory("a", options, backend="s3")
    b = mount_factory("b", options, backend="s3")
    b.url, b.bucket = a.url, a.bucket
    a.mount()
    b.mount()
    data = os.urandom(9 * MIB)
    (a.path / "shared.bin").write_bytes(data)
    # Other mounts see the file once the commit that follows its last close is done.
    wait_until(lambda: os.getxattr(a.path / "shared.bin", "user.nvfs.committed") == b"yes",
               "shared.bin is committed", timeout=30)
    assert (b.path / "shared.bin").read_bytes() == data
    assert sorted(_cached(cache)) == sorted(_chunk_ids(a, "shared.bin"))
    _delete_chunks_from_store(a)
    drop_cache(a.path / "shared.bin")
    assert (a.path / "shared.bin").read_bytes() == data


def test_cache_stays_within_its_size_and_keeps_the_most_recent_chunks(mount_factory, tmp_path):
    cache = _cache_dir(tmp_path)
    limit = 64 * MIB
    mount = mount_factory(backend="s3", options=(f"cache_dir={cache}", f"cache_dir_size={limit}"))
    mount.mount()
    data = os.urandom(100 * MIB)  # incompressible: 25 chunks of 4 MiB, stored raw
    (mount.path / "big.bin").write_bytes(data)
    mount.remount()
    assert (mount.path / "big.bin").read_bytes() == data
    cached = _cached(cache)
    total = sum(path.stat().st_size for path in cached.values())
    assert 0 < total <= limit, f"{total} bytes cached, bound {limit}"
    ids = _chunk_ids(mount, "big.bin")
    assert ids[-1] in cached, "the chunk read last was evicted"
    assert ids[0] not in cached, "the chunk read first outlived later ones"

    mount.umount()  # the bound holds across restarts: the next daemon counts what is there
    mount.mount()
    (mount.path / "other.bin").write_bytes(os.urandom(40 * MIB))
    mount.remount()
    assert len((mount.path / "other.bin").read_bytes()) == 40 * MIB
    total = sum(path.stat().st_size for path in _cached(cache).values())
    assert 0 < total <= limit, f"{total} bytes cached after a remount, bound {limit}"


def test_damaged_cache_entries_are_fetched_again(mount_factory, tmp_path):
    cache = _cache_dir(tmp_path)
    mount = mount_factory(backend="s3", options=(f"cache_dir={cache}",))
    mount.mount()
    data = os.urandom(12 * MIB + 100)
    (mount.path / "ckpt.bin").write_bytes(data)
    mount.remount()
    assert (mount.path / "ckpt.bin").read_bytes() == data
    mount.umount()

    first, second, third, *_ = _chunk_ids(mount, "ckpt.bin")
    entries = _cached(cache)
    flipped = bytearray(entries[first].read_bytes())
    flipped[len(flipped) // 2] ^= 0x01
    entries[first].write_bytes(flipped)
    entries[second].write_bytes(entries[second].read_bytes()[: MIB])  # truncated, as after a crash
    entries[third].write_bytes(b"")
    mount.mount()
    assert (mount.path / "ckpt.bin").read_bytes() == data
    log = mount.log()
    for cid in (first, second, third):
        assert f"disk cache: copy of chunk {cid} is damaged" in log, log
    for cid, path in _cached(cache).items():  # good copies replaced the damaged ones
        assert path.read_bytes() == mount.read_object(f"chunks/{cid[:2]}/{cid}")
