"""Content-addressed dedup and garbage collection of chunks, observed in the backing store."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import drop_cache, wait_until

pytestmark = pytest.mark.fuse

MIB = 1 << 20
SMALL_CHUNK = 64 << 10
_NIBBLES = bytes(range(256)).translate(bytes(b & 0x0F for b in range(256)))


# ----- helpers -----------------------------------------------------------------------------


def is_s3(mount) -> bool:
    return getattr(mount, "s3", None) is not None


def chunk_objects(mount) -> set[str]:
    """Ids of every chunk object in the store (tolerates concurrent deletion by GC)."""
    if is_s3(mount):
        return {key.rsplit("/", 1)[1] for key in mount.keys("chunks/")}
    return {name for _dir, _subdirs, files in os.walk(mount.source / "chunks") for name in files}


def read_key(mount, key: str) -> bytes:
    return mount.read_object(key) if is_s3(mount) else (mount.source / key).read_bytes()


def manifest(mount, relpath: str) -> dict:
    """The file's manifest in the store, once the file's last close has committed it."""
    if os.path.ismount(mount.path):  # close(2) returns before the commit that follows it
        wait_until(lambda: os.getxattr(mount.path / relpath, "user.nvfs.committed") == b"yes",
                   f"{relpath} is committed", timeout=30)
    parts = [("#" + part) if part.startswith("#") else part for part in Path(relpath).parts]
    return json.loads(read_key(mount, "/".join(("tree", *parts))))


def chunk_ids(mount, relpath: str) -> list[str]:
    return [ref[0] for ref in manifest(mount, relpath)["chunks"] if ref is not None]


def referenced_ids(mount) -> set[str]:
    """Every chunk id that some manifest in the store names."""
    if is_s3(mount):
        keys = mount.keys("tree/")
    else:
        keys = [str(Path(d, name).relative_to(mount.source))
                for d, _subdirs, files in os.walk(mount.source / "tree") for name in files]
    ids: set[str] = set()
    for key in keys:
        if key.endswith("/#dir"):
            continue
        doc = json.loads(read_key(mount, key))
        ids.update(ref[0] for ref in doc.get("chunks", []) if ref is not None)
    return ids


def half_entropy(size: int) -> bytes:
    """Random nibbles: compresses to about half, but no two chunks are alike."""
    return os.urandom(size).translate(_NIBBLES)


def sha256_file(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 * MIB):
            digest.update(block)
    return digest.hexdigest()


def gc_options(backend: str) -> tuple[str, ...]:
    # On a shared (S3) store only chunks older than gc_grace are collected, so that another
    # mount may still name them; these tests have that store to themselves.
    return ("gc_grace=0",) if backend == "s3" else ()


@pytest.fixture
def mounted(mount_factory, backend):
    """A fresh store, mounted: once on a directory, once on S3 (collecting without grace)."""
    mount = mount_factory(options=gc_options(backend), backend=backend)
    mount.mount()
    return mount


@pytest.fixture
def small(mount_factory, backend):
    """A fresh store with 64 KiB chunks, mounted: once on a directory, once on S3."""
    mount = mount_factory("small", options=("chunk_size=64k", *gc_options(backend)), backend=backend)
    mount.mount()
    return mount


# ----- dedup -------------------------------------------------------------------------------


def test_identical_files_share_chunks(mounted):
    data = half_entropy(12 * MIB)
    (mounted.path / "one").write_bytes(data)
    first = chunk_objects(mounted)
    assert len(first) == 3
    assert set(chunk_ids(mounted, "one")) == first
    ratio = float(os.getxattr(mounted.path / "one", "user.nvfs.ratio"))
    assert 1.3 < ratio < 3, "test data should be compressible, but not trivially"

    (mounted.path / "two").write_bytes(data)
    (mounted.path / "sub").mkdir()
    (mounted.path / "sub" / "three").write_bytes(data)
    assert chunk_objects(mounted) == first
    assert chunk_ids(mounted, "two") == chunk_ids(mounted, "one") == chunk_ids(mounted, "sub/three")

    mounted.remount()
    for name in ("one", "two", "sub/three"):
        assert (mounted.path / name).read_bytes() == data
    # a file differing in one byte shares all chunks but one
    changed = bytearray(data)
    changed[5 * MIB] ^= 0xFF
    (mounted.path / "four").write_bytes(changed)
    assert len(chunk_objects(mounted)) == 4
    ids_one, ids_four = chunk_ids(mounted, "one"), chunk_ids(mounted, "four")
    assert [a == b for a, b in zip(ids_one, ids_four, strict=True)] == [True, False, True]


def test_repeated_blocks_within_a_file_are_stored_once(small):
    block = half_entropy(SMALL_CHUNK)
    data = block * 40
    (small.path / "rep").write_bytes(data)
    ids = chunk_ids(small, "rep")
    assert len(ids) == 40 and len(set(ids)) == 1
    assert chunk_objects(small) == set(ids)
    stored = int(os.getxattr(small.path / "rep", "user.nvfs.stored_size"))
    logical = int(os.getxattr(small.path / "rep", "user.nvfs.logical_size"))
    assert logical == len(data)
    assert stored > 0
    small.remount()
    assert (small.path / "rep").read_bytes() == data


def test_copy_of_1gib_random_file(mount_factory, tmp_path):
    mounted = mount_factory("big")
    mounted.mount()
    source = tmp_path / "random-1g.bin"
    digest = hashlib.sha256()
    with open(source, "wb") as f:
        for _ in range(64):
            piece = os.urandom(16 * MIB)
            digest.update(piece)
            f.write(piece)
    target = mounted.path / "random-1g.bin"
    subprocess.run(["cp", str(source), str(target)], check=True)
    assert os.path.getsize(target) == 1 << 30
    drop_cache(target)
    subprocess.run(["cmp", str(source), str(target)], check=True)
    assert len(chunk_objects(mounted)) == 256
    assert os.getxattr(target, "user.nvfs.codec") == b"raw"
    assert os.getxattr(target, "user.nvfs.committed") == b"yes"

    mounted.remount()
    assert sha256_file(target) == digest.hexdigest()
    source.unlink()
    os.unlink(target)
    mounted.umount()
    assert chunk_objects(mounted) == set()


# ----- garbage collection ---------------------------------------------------------------------


def test_deleting_files_frees_their_chunks_at_umount(mounted):
    shared = half_entropy(12 * MIB)
    keep = half_entropy(9 * MIB)
    (mounted.path / "a").write_bytes(shared)
    (mounted.path / "b").write_bytes(shared)
    (mounted.path / "keep").write_bytes(keep)
    keep_ids = set(chunk_ids(mounted, "keep"))
    shared_ids = set(chunk_ids(mounted, "a"))
    assert len(keep_ids) == 3 and len(shared_ids) == 3
    assert chunk_objects(mounted) == keep_ids | shared_ids

    os.unlink(mounted.path / "a")
    mounted.umount()
    assert chunk_objects(mounted) == keep_ids | shared_ids, "b still uses the shared chunks"

    mounted.mount()
    assert (mounted.path / "b").read_bytes() == shared
    os.unlink(mounted.path / "b")
    mounted.umount()
    assert chunk_objects(mounted) == keep_ids

    mounted.mount()
    assert (mounted.path / "keep").read_bytes() == keep
    os.unlink(mounted.path / "keep")
    mounted.umount()
    assert chunk_objects(mounted) == set()


def test_removing_a_directory_tree_frees_chunks(small):
    root = small.path / "tree"
    for i in range(5):
        (root / f"d{i}").mkdir(parents=True)
        for j in range(4):
            (root / f"d{i}" / f"f{j}").write_bytes(half_entropy(3 * SMALL_CHUNK + 1 + i * 100 + j))
    assert len(chunk_objects(small)) == 5 * 4 * 4
    subprocess.run(["rm", "-rf", str(root)], check=True)
    small.umount()
    assert chunk_objects(small) == set()


def test_overwrite_frees_old_chunks(mounted):
    path = mounted.path / "f"
    old = half_entropy(12 * MIB)
    path.write_bytes(old)
    old_ids = set(chunk_ids(mounted, "f"))
    new = half_entropy(8 * MIB)
    path.write_bytes(new)  # O_TRUNC and rewrite
    new_ids = set(chunk_ids(mounted, "f"))
    assert not old_ids & new_ids
    mounted.umount()
    assert chunk_objects(mounted) == new_ids
    mounted.mount()
    assert path.read_bytes() == new


def test_overwrite_in_place_frees_replaced_chunk(small):
    path = small.path / "f"
    data = bytearray(half_entropy(4 * SMALL_CHUNK))
    path.write_bytes(data)
    before = chunk_ids(small, "f")
    with open(path, "r+b") as f:
        f.seek(SMALL_CHUNK + 10)
        f.write(b"changed")
    data[SMALL_CHUNK + 10 : SMALL_CHUNK + 17] = b"changed"
    after = chunk_ids(small, "f")
    assert [a == b for a, b in zip(before, after, strict=True)] == [True, False, True, True]
    small.umount()
    assert chunk_objects(small) == set(after)
    small.mount()
    assert path.read_bytes() == data


def test_truncate_frees_dropped_chunks(small):
    path = small.path / "f"
    data = half_entropy(10 * SMALL_CHUNK)
    path.write_bytes(data)
    os.truncate(path, 3 * SMALL_CHUNK + 5)
    ids = set(chunk_ids(small, "f"))
    assert len(ids) == 4
    small.umount()
    assert chunk_objects(small) == ids
    small.mount()
    assert path.read_bytes() == data[: 3 * SMALL_CHUNK + 5]


def test_rename_over_file_frees_replaced_chunks(mounted):
    (mounted.path / "old").write_bytes(half_entropy(5 * MIB))
    new = half_entropy(5 * MIB)
    (mounted.path / "new").write_bytes(new)
    new_ids = set(chunk_ids(mounted, "new"))
    os.rename(mounted.path / "new", mounted.path / "old")
    mounted.umount()
    assert chunk_objects(mounted) == new_ids
    mounted.mount()
    assert (mounted.path / "old").read_bytes() == new


def test_gc_keeps_chunks_of_open_unlinked_file(small):
    victim = small.path / "victim"
    data = half_entropy(6 * SMALL_CHUNK)
    victim.write_bytes(data)
    small.remount()
    other = small.path / "other"
    other.write_bytes(half_entropy(2 * SMALL_CHUNK))
    other_ids = set(chunk_ids(small, "other"))
    fd = os.open(victim, os.O_RDONLY)
    try:
        os.unlink(victim)
        # a GC pass that starts after this unlink deletes other's chunks: once they are gone,
        # a pass has run while the victim was unlinked but open
        os.unlink(other)
        wait_until(lambda: not chunk_objects(small) & other_ids, "a GC pass removed other's chunks")
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert os.pread(fd, len(data) + 1, 0) == data
    finally:
        os.close(fd)


def test_unlink_during_gc_pass_then_immediate_umount(small):
    """A GC request made while a pass is running must be served before the daemon exits."""
    big = small.path / "big"
    with open(big, "wb") as f:
        for _ in range(32):
            f.write(os.urandom(MIB))
    (small.path / "late").write_bytes(os.urandom(4 * SMALL_CHUNK))
    total = len(chunk_objects(small))
    assert total == 512 + 4
    os.unlink(big)
    # the pass that serves this unlink is sweeping once chunks start to disappear; its mark
    # phase has then seen 'late' alive
    wait_until(lambda: len(chunk_objects(small)) < total, "the GC sweep started")
    os.unlink(small.path / "late")
    small.umount()
    assert chunk_objects(small) == set()


def test_unlinked_open_file_chunks_freed_at_umount(small):
    """Chunks of a file unlinked while open are garbage once it is closed."""
    path = small.path / "f"
    path.write_bytes(half_entropy(5 * SMALL_CHUNK))
    keep = small.path / "keep"
    keep.write_bytes(b"keep me")
    keep_ids = set(chunk_ids(small, "keep"))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.unlink(path)
        assert os.pread(fd, 10, 0)
    finally:
        os.close(fd)
    small.umount()
    assert chunk_objects(small) == keep_ids


def test_new_file_unlinked_before_close_leaves_no_chunks(small):
    """Also the chunks whose upload was still under way when the file was closed."""
    fd = os.open(small.path / "tmpfile", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, half_entropy(160 * SMALL_CHUNK))  # full chunks are stored while writing
        os.unlink(small.path / "tmpfile")
    finally:
        os.close(fd)
    small.umount()
    assert chunk_objects(small) == set()


def test_rewriting_a_new_file_before_close_leaves_no_orphans(small):
    """Chunks stored for data that was overwritten or truncated before the first commit are garbage."""
    path = small.path / "f"
    final = half_entropy(3 * SMALL_CHUNK)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, half_entropy(3 * SMALL_CHUNK))
        os.pwrite(fd, final, 0)
        os.write(fd, half_entropy(4 * SMALL_CHUNK))
        os.ftruncate(fd, len(final))
    finally:
        os.close(fd)
    ids = set(chunk_ids(small, "f"))
    small.umount()
    assert chunk_objects(small) == ids
    small.mount()
    assert path.read_bytes() == final


def test_store_holds_only_referenced_chunks_after_mixed_workload(small):
    p = small.path
    (p / "d").mkdir()
    for i in range(6):
        (p / "d" / f"f{i}").write_bytes(half_entropy((i + 1) * SMALL_CHUNK + i))
    (p / "dup").write_bytes((p / "d" / "f3").read_bytes())
    os.rename(p / "d" / "f1", p / "d" / "f2")
    os.unlink(p / "d" / "f0")
    os.truncate(p / "d" / "f5", SMALL_CHUNK)
    with open(p / "d" / "f4", "r+b") as f:
        f.seek(2 * SMALL_CHUNK)
        f.write(b"x" * SMALL_CHUNK)
    (p / "d" / "f3").write_bytes(b"short")
    small.umount()
    assert chunk_objects(small) == referenced_ids(small)
    assert referenced_ids(small)
    small.mount()
    assert sorted(os.listdir(p / "d")) == ["f2", "f3", "f4", "f5"]
