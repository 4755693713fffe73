"""POSIX behaviour of a real nvfs mount: data paths, namespace operations, attributes, persistence."""

from __future__ import annotations

import concurrent.futures
import ctypes
import errno
import hashlib
import json
import mmap
import os
import random
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from nvfs.store import DEFAULT_CHUNK_SIZE
from tests.conftest import drop_cache, wait_until

pytestmark = pytest.mark.fuse

KIB = 1 << 10
MIB = 1 << 20
SMALL_CHUNK = 64 * KIB

# (mount options, chunk size they give) for tests that must hold at either chunk size
CHUNK_SIZES = [
    pytest.param(((), DEFAULT_CHUNK_SIZE), id="chunk-default"),
    pytest.param((("chunk_size=64k",), SMALL_CHUNK), id="chunk64k"),
]


# ----- helpers -----------------------------------------------------------------------------


def store_key(mount, relpath: str) -> str:
    """The key of the manifest of ``relpath`` (a file or symlink) in the store."""
    parts = [("#" + part) if part.startswith("#") else part for part in Path(relpath).parts]
    return "/".join(("tree", *parts))


def is_s3(mount) -> bool:
    return getattr(mount, "s3", None) is not None


def read_key(mount, key: str) -> bytes:
    return mount.read_object(key) if is_s3(mount) else (mount.source / key).read_bytes()


def has_key(mount, key: str) -> bool:
    return key in mount.keys(key) if is_s3(mount) else (mount.source / key).is_file()


def wait_committed(path: Path) -> None:
    """Wait for the commit that follows a file's last close (close(2) returns before it)."""
    wait_until(lambda: os.getxattr(path, "user.nvfs.committed") == b"yes", f"{path} is committed",
               timeout=30)


def manifest(mount, relpath: str) -> dict:
    """The manifest of ``relpath`` in the store, once its last close has committed it."""
    if os.path.ismount(mount.path) and os.path.isfile(mount.path / relpath):
        wait_committed(mount.path / relpath)
    return json.loads(read_key(mount, store_key(mount, relpath)))


def dir_marker(mount, relpath: str) -> dict:
    return json.loads(read_key(mount, store_key(mount, relpath) + "/#dir"))


def chunk_objects(mount) -> set[str]:
    if is_s3(mount):
        return {key.rsplit("/", 1)[1] for key in mount.keys("chunks/")}
    return {name for _dir, _subdirs, files in os.walk(mount.source / "chunks") for name in files}


def compressible(size: int, seed: int = 0) -> bytes:
    """Text-like data that zstd compresses well but that is not one repeated block."""
    rng = random.Random(seed)
    words = [bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(500)]
    out = bytearray()
    while len(out) < size:
        out += b" ".join(rng.choices(words, k=64)) + b"\n"
    return bytes(out[:size])


def randbytes(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def read_fresh(path) -> bytes:
    drop_cache(path)
    return Path(path).read_bytes()


def assert_reads_back(mount, path, expected: bytes) -> None:
    """``path`` reads back as ``expected`` from the daemon (page cache dropped), and after a remount."""
    assert read_fresh(path) == expected
    mount.remount()
    assert path.read_bytes() == expected


def snapshot(root: Path) -> dict:
    """Everything observable about a tree: type, mode, owner, size, mtime, contents, link targets."""
    result = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            full = Path(directory) / name
            rel = str(full.relative_to(root))
            st = os.lstat(full)
            entry = {"mode": st.st_mode, "uid": st.st_uid, "gid": st.st_gid}
            if stat.S_ISLNK(st.st_mode):
                entry["target"] = os.readlink(full)
            elif stat.S_ISREG(st.st_mode):
                entry["size"] = st.st_size
                entry["mtime_ns"] = st.st_mtime_ns
                entry["sha256"] = hashlib.sha256(full.read_bytes()).hexdigest()
            result[rel] = entry
    return result


def expect_errno(err: int, fn, *args, **kwargs) -> None:
    with pytest.raises(OSError) as info:
        fn(*args, **kwargs)
    assert info.value.errno == err, f"expected {errno.errorcode[err]}, got {info.value!r}"


@pytest.fixture
def small(mount_factory):
    """A fresh store mounted with 64 KiB chunks."""
    mount = mount_factory("small", options=("chunk_size=64k",))
    mount.mount()
    return mount


@pytest.fixture(params=CHUNK_SIZES)
def any_chunk(request, mount_factory):
    """A fresh store mounted with each chunk size in turn; yields (mount, chunk_size)."""
    options, chunk = request.param
    mount = mount_factory("any", options=options)
    mount.mount()
    return mount, chunk


# ----- data path --------------------------------------------------------------------------


def test_create_write_read_and_stat(mounted):
    path = mounted.path / "a.bin"
    data = randbytes(3 * MIB + 17, 1)
    with open(path, "xb") as f:
        f.write(data)
    assert os.stat(path).st_size == len(data)
    assert stat.S_ISREG(os.stat(path).st_mode)
    assert read_fresh(path) == data
    expect_errno(errno.EEXIST, open, path, "xb")
    mounted.remount()
    assert os.stat(path).st_size == len(data)
    assert path.read_bytes() == data


def test_sequential_write_in_uneven_pieces(any_chunk):
    mount, chunk = any_chunk
    path = mount.path / "seq"
    rng = random.Random(2)
    data = randbytes(2 * chunk + 12345, 2)
    with open(path, "wb", buffering=0) as f:
        position = 0
        while position < len(data):
            step = rng.choice([1, 7, 4095, 4096, 4097, 65535, 65536, 200_000])
            f.write(data[position : position + step])
            position += step
            assert f.tell() == min(position, len(data))
    assert os.path.getsize(path) == len(data)
    assert_reads_back(mount, path, data)


def test_random_writes_match_model(any_chunk):
    mount, chunk = any_chunk
    path = mount.path / "random"
    rng = random.Random(3)
    size = 3 * chunk + 999
    model = bytearray(randbytes(size, 3))
    path.write_bytes(model)
    fd = os.open(path, os.O_RDWR)
    try:
        for step in range(60):
            offset = rng.randrange(0, size)
            length = rng.choice([1, 100, 4096, chunk - 1, chunk, chunk + 1])
            length = min(length, size - offset)
            piece = rng.randbytes(length)
            assert os.pwrite(fd, piece, offset) == length
            model[offset : offset + length] = piece
            if step % 10 == 0:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                assert os.pread(fd, size + 10, 0) == model
    finally:
        os.close(fd)
    assert os.path.getsize(path) == size
    assert_reads_back(mount, path, model)


def test_overwrite_in_place(any_chunk):
    mount, chunk = any_chunk
    path = mount.path / "inplace"
    original = compressible(2 * chunk + 500, 4)
    path.write_bytes(original)
    patch = randbytes(1000, 4)
    offset = chunk - 300  # straddles the first chunk boundary
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(patch)
    expected = original[:offset] + patch + original[offset + len(patch):]
    assert os.path.getsize(path) == len(original)
    assert_reads_back(mount, path, expected)
    # and once more after the remount, at the very end of the file
    with open(path, "r+b") as f:
        f.seek(len(expected) - 10)
        f.write(b"X" * 10)
    expected = expected[:-10] + b"X" * 10
    assert_reads_back(mount, path, expected)


def test_append(any_chunk):
    mount, chunk = any_chunk
    path = mount.path / "log"
    expected = b""
    for i in range(5):
        piece = randbytes(chunk // 3 + i, 10 + i)
        with open(path, "ab") as f:
            f.write(piece)
        expected += piece
        assert os.path.getsize(path) == len(expected)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, b"tail")  # O_APPEND ignores the seek
    finally:
        os.close(fd)
    expected += b"tail"
    assert_reads_back(mount, path, expected)


def test_truncate_path_shrink_inside_chunk_then_grow_reads_zeros(any_chunk):
    mount, chunk = any_chunk
    path = mount.path / "t"
    data = randbytes(2 * chunk + 1000, 5)
    path.write_bytes(data)
    cut = chunk + 1234  # inside the second chunk
    os.truncate(path, cut)
    assert os.path.getsize(path) == cut
    assert read_fresh(path) == data[:cut]
    grown = 3 * chunk + 77
    os.truncate(path, grown)
    assert os.path.getsize(path) == grown
    expected = data[:cut] + bytes(grown - cut)
    assert read_fresh(path) == expected
    mount.remount()
    assert os.path.getsize(path) == grown
    assert path.read_bytes() == expected
    # shrink to a chunk boundary, to zero, and grow from zero
    os.truncate(path, chunk)
    assert read_fresh(path) == expected[:chunk]
    os.truncate(path, 0)
    assert read_fresh(path) == b""
    os.truncate(path, 5000)
    assert read_fresh(path) == bytes(5000)
    mount.remount()
    assert path.read_bytes() == bytes(5000)


def test_ftruncate_on_open_fd(any_chunk):
    mount, chunk = any_chunk
    path = mount.path / "ft"
    data = randbytes(2 * chunk + 4321, 6)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        cut = chunk + 10
        os.ftruncate(fd, cut)
        assert os.fstat(fd).st_size == cut
        os.ftruncate(fd, 2 * chunk + 4321)  # grow back: the cut-off bytes must not come back
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        expected = bytearray(data[:cut] + bytes(2 * chunk + 4321 - cut))
        assert os.pread(fd, len(expected) + 100, 0) == expected
        # shrink inside the *first* chunk, write after the new end, then read it all
        os.ftruncate(fd, 100)
        os.pwrite(fd, b"Z" * 50, 300)
        expected = bytearray(data[:100] + bytes(200) + b"Z" * 50)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert os.pread(fd, 10_000, 0) == expected
        os.fsync(fd)
        os.ftruncate(fd, chunk + 1)
        expected += bytes(chunk + 1 - len(expected))
    finally:
        os.close(fd)
    assert_reads_back(mount, path, expected)


def test_shrink_of_committed_file_then_grow_in_same_open(any_chunk):
    """Data that was stored in a chunk must not reappear after shrink + grow."""
    mount, chunk = any_chunk
    path = mount.path / "sg"
    data = b"\xff" * (chunk + 100)
    path.write_bytes(data)
    mount.remount()
    with open(path, "r+b") as f:
        f.truncate(50)
        f.truncate(chunk + 100)
        f.seek(0)
        assert f.read() == b"\xff" * 50 + bytes(chunk + 50)
    expected = b"\xff" * 50 + bytes(chunk + 50)
    assert_reads_back(mount, path, expected)


def test_read_at_arbitrary_offsets(any_chunk):
    mount, chunk = any_chunk
    path = mount.path / "r"
    data = randbytes(3 * chunk + 333, 7)
    path.write_bytes(data)
    mount.remount()
    rng = random.Random(7)
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        for _ in range(200):
            offset = rng.randrange(0, len(data) + 2 * chunk)
            length = rng.choice([0, 1, 511, 4096, chunk, 2 * chunk + 1, rng.randrange(1, 3 * chunk)])
            assert os.pread(fd, length, offset) == data[offset : offset + length]
            if rng.random() < 0.2:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        # backwards sequential reads
        for offset in range(len(data) - 4096, -1, -chunk // 2):
            assert os.pread(fd, 4096, offset) == data[offset : offset + 4096]


def test_mmap_read_and_write(small):
    path = small.path / "mapped"
    data = bytearray(randbytes(5 * SMALL_CHUNK + 123, 22))
    path.write_bytes(data)
    small.remount()
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mapped:
        assert mapped[:] == data
        assert mapped[SMALL_CHUNK - 5 : SMALL_CHUNK + 5] == data[SMALL_CHUNK - 5 : SMALL_CHUNK + 5]
        mapped[2 * SMALL_CHUNK - 3 : 2 * SMALL_CHUNK + 3] = b"mapped"
        mapped.flush()
    data[2 * SMALL_CHUNK - 3 : 2 * SMALL_CHUNK + 3] = b"mapped"
    assert read_fresh(path) == data
    small.remount()
    assert path.read_bytes() == data


def test_concurrent_writers_and_readers(small):
    def writer(i: int) -> bytes:
        data = randbytes(3 * SMALL_CHUNK + 1000 * i, 100 + i)
        with open(small.path / f"w{i}", "wb") as f:
            for start in range(0, len(data), 10_000):
                f.write(data[start : start + 10_000])
        return data

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        written = list(pool.map(writer, range(12)))
    for i, data in enumerate(written):
        assert read_fresh(small.path / f"w{i}") == data

    big = randbytes(40 * SMALL_CHUNK, 200)
    (small.path / "big").write_bytes(big)
    small.remount()

    def reader(i: int) -> int:
        rng = random.Random(i)
        with open(small.path / "big", "rb", buffering=0) as f:
            for _ in range(60):
                offset, length = rng.randrange(len(big)), rng.randrange(1, 4 * SMALL_CHUNK)
                assert os.pread(f.fileno(), length, offset) == big[offset : offset + length]
        return i

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert sorted(pool.map(reader, range(8))) == list(range(8))


_READERS = r"""
import os, sys, threading
path, threads, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "rb") as f:
    data = f.read()
failures = []
def reader(seed):
    fd = os.open(path, os.O_RDONLY)
    try:
        for i in range(rounds):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            offset = ((seed + i) % 4) * 65536
            if os.pread(fd, 2 * 65536, offset) != data[offset : offset + 2 * 65536]:
                failures.append(f"reader {seed} round {i}: wrong data")
    except OSError as exc:
        failures.append(f"reader {seed} round {i}: {exc!r}")
    finally:
        os.close(fd)
workers = [threading.Thread(target=reader, args=(n,)) for n in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
print("\n".join(failures[:10]))
sys.exit(1 if failures else 0)
"""


def test_concurrent_reads_of_uncached_chunks(mount_factory):
    """Readers (and read-ahead) waiting for the same chunk while nothing can be cached."""
    mount = mount_factory("nocache", options=("chunk_size=64k",))
    mount.mount()
    data = randbytes(8 * SMALL_CHUNK, 23)
    (mount.path / "f").write_bytes(data)
    mount.umount()
    mount.mount("cache_size=0")
    daemon = mount.daemon_pid()
    try:
        result = subprocess.run([sys.executable, "-c", _READERS, str(mount.path / "f"), "12", "150"],
                                capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        os.kill(daemon, signal.SIGKILL)  # a hung request: fail instead of hanging the test run
        pytest.fail("concurrent readers hung (the daemon was killed)")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (mount.path / "f").read_bytes() == data
    assert "Traceback" not in mount.log()


def resident_pages(path) -> int:
    """How many of the file's pages are in the kernel page cache (mincore(2) of a mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vector = ctypes.create_string_buffer(pages)
            assert libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
            return sum(byte & 1 for byte in vector.raw)
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


@pytest.mark.parametrize(("options", "cached"), [((), False), (("cached_writes",), True)],
                         ids=["default", "cached_writes"])
def test_write_only_handles_bypass_the_page_cache(mount_factory, options, cached):
    """torch.save and cp open write-only and truncate: their pages go to nvfs, not the page cache."""
    mount = mount_factory(options=options)
    mount.mount()
    path = mount.path / "ckpt.pt"
    data = randbytes(4 * MIB, 40)
    with open(path, "wb") as f:
        f.write(data)
    resident = resident_pages(path)
    assert resident == (len(data) // mmap.PAGESIZE if cached else 0)
    assert read_fresh(path) == data


def test_whole_file_rewrite_is_seen_by_a_reader_holding_cached_pages(small):
    path = small.path / "shared"
    data = randbytes(6 * SMALL_CHUNK, 41)
    path.write_bytes(data)
    with open(path, "rb") as reader:
        assert reader.read() == data  # its pages are now cached (and kept across opens)
        assert resident_pages(path) > 0
        rewritten = randbytes(5 * SMALL_CHUNK + 100, 42)
        path.write_bytes(rewritten)  # O_WRONLY | O_TRUNC: past the page cache
        assert os.pread(reader.fileno(), len(data), 0) == rewritten
    assert_reads_back(small, path, rewritten)


def test_dirty_cached_pages_and_a_whole_file_writer(small):
    """Dirty pages of a read-write handle land before a direct write of the same range, never after."""
    path = small.path / "mixed"
    direct = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # past the page cache
    try:
        data = bytearray(randbytes(4 * SMALL_CHUNK, 43))
        os.pwrite(direct, data, 0)
        with open(path, "r+b") as cached:
            first = randbytes(2 * SMALL_CHUNK, 44)
            os.pwrite(cached.fileno(), first, 0)  # dirty in the writeback cache for now
            data[: len(first)] = first
            second = randbytes(2 * SMALL_CHUNK, 45)
            os.pwrite(direct, second, SMALL_CHUNK)
            data[SMALL_CHUNK : 3 * SMALL_CHUNK] = second
            assert os.pread(cached.fileno(), len(data), 0) == data
    finally:
        os.close(direct)
    assert_reads_back(small, path, bytes(data))


def test_dirty_cached_pages_do_not_land_on_a_later_truncating_writer(small):
    """A read-write handle's dirty pages do not come back after a direct writer truncated the file."""
    path = small.path / "mixed"
    path.write_bytes(randbytes(4 * SMALL_CHUNK, 46))
    with open(path, "r+b") as cached:
        os.pwrite(cached.fileno(), randbytes(2 * SMALL_CHUNK, 47), 0)  # dirty in the writeback cache
        direct = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            second = randbytes(2 * SMALL_CHUNK, 48)
            os.pwrite(direct, second, SMALL_CHUNK)
        finally:
            os.close(direct)
        expected = bytes(SMALL_CHUNK) + second
        assert os.pread(cached.fileno(), 4 * SMALL_CHUNK, 0) == expected
    assert_reads_back(small, path, expected)


def test_sparse_file(small):
    path = small.path / "sparse"
    head, tail = b"head", b"tail-data"
    gap = 10 * SMALL_CHUNK + 5
    with open(path, "wb") as f:
        f.write(head)
        f.seek(gap)
        f.write(tail)
    size = gap + len(tail)
    assert os.path.getsize(path) == size
    expected = head + bytes(gap - len(head)) + tail
    assert read_fresh(path) == expected
    doc = manifest(small, "sparse")
    assert doc["size"] == size
    assert doc["chunk_size"] == SMALL_CHUNK
    assert len(doc["chunks"]) == 11
    assert doc["chunks"][1:10] == [None] * 9, "untouched chunks should be holes, not stored zeros"
    assert os.stat(path).st_blocks * 512 < 64 * KIB
    small.remount()
    assert path.read_bytes() == expected
    # write into the middle of the hole
    with open(path, "r+b") as f:
        f.seek(5 * SMALL_CHUNK - 2)
        f.write(b"MID!")
    expected = expected[: 5 * SMALL_CHUNK - 2] + b"MID!" + expected[5 * SMALL_CHUNK + 2:]
    assert read_fresh(path) == expected
    small.remount()
    assert path.read_bytes() == expected


# ----- namespace --------------------------------------------------------------------------


NAMES = [
    "with space",
    " leading and trailing ",
    "ünïcödé-名前-🙂",
    "#hash",
    "##double",
    "#dir",
    "#",
    "x" * 254,
    "ü" * 127,  # 254 bytes in UTF-8
    "dot.ted.name",
    "-dash",
]


def test_readdir_names(mounted):
    for i, name in enumerate(NAMES):
        (mounted.path / name).write_bytes(name.encode() + bytes([i]))
    (mounted.path / "#subdir").mkdir()
    (mounted.path / "#subdir" / "#inner").write_bytes(b"inner")
    (mounted.path / "##dir2").mkdir()
    expected = sorted([*NAMES, "#subdir", "##dir2"])
    assert sorted(os.listdir(mounted.path)) == expected
    assert os.listdir(mounted.path / "#subdir") == ["#inner"]
    assert os.listdir(mounted.path / "##dir2") == []
    undecodable = os.fsencode(mounted.path) + b"/not-utf8-\xff\xfe"
    with open(undecodable, "wb") as f:
        f.write(b"bytes name")
    expected_bytes = sorted(os.fsencode(name) for name in expected) + [b"not-utf8-\xff\xfe"]
    assert sorted(os.listdir(os.fsencode(mounted.path))) == sorted(expected_bytes)
    expect_errno(errno.ENAMETOOLONG, open, mounted.path / ("y" * 256), "wb")
    expect_errno(errno.ENAMETOOLONG, os.mkdir, mounted.path / ("y" * 256))
    expect_errno(errno.ENAMETOOLONG, os.rename, mounted.path / "-dash", mounted.path / ("y" * 256))
    expect_errno(errno.ENAMETOOLONG, os.symlink, "target", mounted.path / ("y" * 256))
    # a directory called '#dir' next to its parent's '#dir' marker
    (mounted.path / "#subdir" / "#dir").mkdir()
    (mounted.path / "#subdir" / "#dir" / "f").write_bytes(b"in #dir")
    assert sorted(os.listdir(mounted.path / "#subdir")) == ["#dir", "#inner"]
    # the store escapes names that start with '#' (in manifests the last closes commit)
    for path in (*(mounted.path / name for name in NAMES), mounted.path / "#subdir" / "#inner",
                 mounted.path / "#subdir" / "#dir" / "f"):
        wait_committed(path)
    assert has_key(mounted, "tree/##hash")
    assert has_key(mounted, "tree/###double")
    assert has_key(mounted, "tree/##dir")
    assert has_key(mounted, "tree/##subdir/##inner")
    assert has_key(mounted, "tree/##subdir/##dir/f")
    assert has_key(mounted, "tree/###dir2/#dir")
    mounted.remount()
    assert sorted(os.listdir(os.fsencode(mounted.path))) == sorted(expected_bytes)
    with open(undecodable, "rb") as f:
        assert f.read() == b"bytes name"
    os.unlink(undecodable)
    assert sorted(os.listdir(mounted.path)) == expected
    for i, name in enumerate(NAMES):
        assert (mounted.path / name).read_bytes() == name.encode() + bytes([i]), name
    assert (mounted.path / "#subdir" / "#inner").read_bytes() == b"inner"
    assert sorted(os.listdir(mounted.path / "#subdir")) == ["#dir", "#inner"]
    assert (mounted.path / "#subdir" / "#dir" / "f").read_bytes() == b"in #dir"
    assert os.path.isdir(mounted.path / "##dir2")
    assert os.listdir(mounted.path / "##dir2") == []


def test_readdir_many_entries(mounted):
    names = {f"file-{i:04d}" for i in range(600)}
    for name in names:
        (mounted.path / name).touch()
    assert set(os.listdir(mounted.path)) == names
    with os.scandir(mounted.path) as entries:
        assert {e.name for e in entries if e.is_file()} == names
    mounted.remount()
    assert set(os.listdir(mounted.path)) == names


def test_mkdir_rmdir(mounted):
    base = mounted.path / "d"
    base.mkdir(mode=0o750)
    (base / "sub" / "deeper").mkdir(parents=True)
    (base / "sub" / "deeper" / "f").write_bytes(b"x")
    assert stat.S_IMODE(os.stat(base).st_mode) == 0o750
    assert dir_marker(mounted, "d")["type"] == "dir"  # durable on return
    expect_errno(errno.EEXIST, os.mkdir, base)
    expect_errno(errno.ENOTEMPTY, os.rmdir, base / "sub")
    expect_errno(errno.ENOTDIR, os.rmdir, base / "sub" / "deeper" / "f")
    expect_errno(errno.ENOENT, os.rmdir, base / "nope")
    expect_errno(errno.EISDIR, os.unlink, base / "sub")
    os.unlink(base / "sub" / "deeper" / "f")
    os.rmdir(base / "sub" / "deeper")
    assert not has_key(mounted, "tree/d/sub/deeper/#dir")
    assert os.listdir(base / "sub") == []
    mounted.remount()
    assert stat.S_IMODE(os.stat(base).st_mode) == 0o750
    assert os.listdir(base) == ["sub"]
    assert os.listdir(base / "sub") == []
    os.rmdir(base / "sub")
    os.rmdir(base)
    assert os.listdir(mounted.path) == []
    mounted.remount()
    assert os.listdir(mounted.path) == []


def test_rename_file_replacing_existing_target(mounted):
    a, b = mounted.path / "a", mounted.path / "b"
    a.write_bytes(b"new contents")
    b.write_bytes(b"old contents that are longer")
    os.rename(a, b)
    assert not a.exists()
    assert b.read_bytes() == b"new contents"
    assert os.listdir(mounted.path) == ["b"]
    assert not has_key(mounted, store_key(mounted, "a"))  # durable on return
    assert manifest(mounted, "b")["size"] == len(b"new contents")
    # across directories, and onto a name starting with '#'
    (mounted.path / "dir").mkdir()
    os.rename(b, mounted.path / "dir" / "#moved")
    mounted.remount()
    assert os.listdir(mounted.path) == ["dir"]
    assert (mounted.path / "dir" / "#moved").read_bytes() == b"new contents"


def test_rename_directories(mounted):
    p = mounted.path
    (p / "src" / "inner").mkdir(parents=True)
    (p / "src" / "inner" / "f").write_bytes(b"payload")
    (p / "src" / "g").write_bytes(b"g")
    (p / "empty").mkdir()
    (p / "full").mkdir()
    (p / "full" / "x").write_bytes(b"x")
    (p / "file").write_bytes(b"file")

    expect_errno(errno.ENOTEMPTY, os.rename, p / "src", p / "full")
    expect_errno(errno.EINVAL, os.rename, p / "src", p / "src" / "inner" / "moved")
    expect_errno(errno.ENOTDIR, os.rename, p / "src", p / "file")
    expect_errno(errno.EISDIR, os.rename, p / "file", p / "empty")

    os.rename(p / "src", p / "empty")  # onto an empty directory
    assert sorted(os.listdir(p)) == ["empty", "file", "full"]
    assert (p / "empty" / "inner" / "f").read_bytes() == b"payload"
    assert (p / "empty" / "g").read_bytes() == b"g"
    os.rename(p / "empty", p / "full" / "nested")
    assert sorted(os.listdir(p / "full")) == ["nested", "x"]
    mounted.remount()
    assert sorted(os.listdir(p)) == ["file", "full"]
    assert sorted(os.listdir(p / "full")) == ["nested", "x"]
    assert sorted(os.listdir(p / "full" / "nested")) == ["g", "inner"]
    assert (p / "full" / "nested" / "inner" / "f").read_bytes() == b"payload"
    assert (p / "full" / "x").read_bytes() == b"x"


def test_rename_open_file_while_writing(any_chunk):
    mount, chunk = any_chunk
    p = mount.path
    data = randbytes(2 * chunk + 10, 8)
    (p / "dst").write_bytes(b"to be replaced")
    with open(p / "src", "wb") as f:
        f.write(data[: chunk + 5])
        os.rename(p / "src", p / "dst")
        f.write(data[chunk + 5 :])
    assert sorted(os.listdir(p)) == ["dst"]
    assert read_fresh(p / "dst") == data
    assert manifest(mount, "dst")["size"] == len(data)
    mount.remount()
    assert sorted(os.listdir(p)) == ["dst"]
    assert (p / "dst").read_bytes() == data


def test_rename_directory_holding_file_being_written(mounted):
    p = mounted.path
    (p / "d1").mkdir()
    data = randbytes(5 * MIB, 9)
    with open(p / "d1" / "f", "wb") as f:
        f.write(data[: 3 * MIB])
        os.rename(p / "d1", p / "d2")
        f.write(data[3 * MIB :])
    assert os.listdir(p) == ["d2"]
    assert read_fresh(p / "d2" / "f") == data
    mounted.remount()
    assert os.listdir(p) == ["d2"]
    assert (p / "d2" / "f").read_bytes() == data


def test_unlink(mounted):
    path = mounted.path / "gone"
    path.write_bytes(b"data")
    os.unlink(path)
    assert not path.exists()
    assert not has_key(mounted, store_key(mounted, "gone"))  # durable on return
    expect_errno(errno.ENOENT, os.unlink, path)
    mounted.remount()
    assert os.listdir(mounted.path) == []


def test_unlink_open_file_stays_readable_through_fd(any_chunk):
    mount, chunk = any_chunk
    path = mount.path / "open-unlinked"
    data = randbytes(2 * chunk + 99, 11)
    path.write_bytes(data)
    mount.remount()  # so reads must come from stored chunks
    fd = os.open(path, os.O_RDWR)
    try:
        assert os.pread(fd, 10, 0) == data[:10]
        os.unlink(path)
        assert not path.exists()
        assert os.listdir(mount.path) == []
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert os.pread(fd, len(data) + 1, 0) == data
        os.pwrite(fd, b"more", len(data))
        assert os.fstat(fd).st_size == len(data) + 4
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert os.pread(fd, len(data) + 10, 0) == data + b"more"
        # a new file of the same name is a different file
        path.write_bytes(b"newcomer")
        assert os.pread(fd, 4, len(data)) == b"more"
    finally:
        os.close(fd)
    assert path.read_bytes() == b"newcomer"
    mount.remount()
    assert os.listdir(mount.path) == ["open-unlinked"]
    assert path.read_bytes() == b"newcomer"


def test_chmod_chown_utime_persist(mounted):
    p = mounted.path
    f, d = p / "f", p / "d"
    f.write_bytes(b"abc")
    d.mkdir()
    os.chmod(f, 0o640)
    os.chmod(d, 0o711)
    os.chown(f, 1234, 5678)
    os.chown(d, 4321, 8765)
    times = {f: 1_234_567_890_123_456_789, d: 1_111_111_111_222_333_444}
    for path, mtime in times.items():
        os.utime(path, ns=(mtime - 10**9, mtime))
    for _ in range(2):
        st = os.stat(f)
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 1234, 5678)
        assert stat.S_ISREG(st.st_mode)
        assert st.st_mtime_ns == times[f]
        st = os.stat(d)
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o711, 4321, 8765)
        assert stat.S_ISDIR(st.st_mode)
        assert st.st_mtime_ns == times[d]
        assert f.read_bytes() == b"abc"
        mounted.remount()
    # durable on return: the store holds the new attributes without a remount
    os.chmod(f, 0o600)
    assert manifest(mounted, "f")["mode"] & 0o7777 == 0o600
    os.chmod(d, 0o700)
    assert dir_marker(mounted, "d")["mode"] & 0o7777 == 0o700


def test_chmod_of_open_file_visible_at_once_and_durable_at_close(mounted):
    path = mounted.path / "f"
    path.write_bytes(b"abc")
    with open(path, "r+b") as f:
        os.chmod(path, 0o604)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o604
        assert stat.S_IMODE(os.fstat(f.fileno()).st_mode) == 0o604
        f.write(b"X")
    assert manifest(mounted, "f")["mode"] & 0o7777 == 0o604
    mounted.remount()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o604
    assert path.read_bytes() == b"Xbc"


def test_touch_updates_mtime_and_creates_empty_file(mounted):
    path = mounted.path / "empty"
    subprocess.run(["touch", str(path)], check=True)
    assert path.exists() and os.path.getsize(path) == 0
    assert manifest(mounted, "empty")["size"] == 0
    os.utime(path, ns=(0, 10**18))
    subprocess.run(["touch", str(path)], check=True)
    touched = os.stat(path).st_mtime_ns
    assert touched > 10**18  # "now" is after 2001-09-09
    mounted.remount()
    assert path.exists()
    assert os.path.getsize(path) == 0
    assert path.read_bytes() == b""
    assert os.stat(path).st_mtime_ns == touched


def test_file_mtime_persists(mounted):
    path = mounted.path / "m"
    path.write_bytes(b"1")
    mtime = os.stat(path).st_mtime_ns
    assert mtime > 0
    mounted.remount()
    assert os.stat(path).st_mtime_ns == mtime


@pytest.mark.parametrize("flags", [os.O_TRUNC, 0], ids=["truncating", "in_place"])
def test_write_only_rewrite_moves_the_mtime(mounted, flags):
    """A rewrite (direct or cached) moves the mtime, and the mount shows what it stores."""
    path = mounted.path / "m"
    path.write_bytes(b"0123456789")
    old = 10**18  # 2001-09-09, long before this test ran
    os.utime(path, ns=(old, old))
    fd = os.open(path, os.O_WRONLY | flags)
    try:
        os.pwrite(fd, b"ab", 4)
    finally:
        os.close(fd)
    mtime = os.stat(path).st_mtime_ns
    assert mtime > old
    mounted.remount()
    assert os.stat(path).st_mtime_ns == mtime
    assert path.read_bytes() == (b"\0\0\0\0ab" if flags else b"0123ab6789")


def test_symlink_readlink_persist(mounted):
    p = mounted.path
    (p / "target").write_bytes(b"pointed-to")
    os.symlink("target", p / "rel")
    os.symlink("/nonexistent/dangling", p / "dangling")
    os.symlink("#weird target with spaces", p / "#link")
    for _ in range(2):
        assert os.readlink(p / "rel") == "target"
        assert (p / "rel").read_bytes() == b"pointed-to"
        assert os.readlink(p / "dangling") == "/nonexistent/dangling"
        assert not (p / "dangling").exists()
        assert os.readlink(p / "#link") == "#weird target with spaces"
        st = os.lstat(p / "rel")
        assert stat.S_ISLNK(st.st_mode)
        assert st.st_size == len("target")
        assert sorted(os.listdir(p)) == ["#link", "dangling", "rel", "target"]
        mounted.remount()
    expect_errno(errno.EINVAL, os.readlink, p / "target")
    os.rename(p / "rel", p / "rel2")
    os.unlink(p / "dangling")
    mounted.remount()
    assert os.readlink(p / "rel2") == "target"
    assert sorted(os.listdir(p)) == ["#link", "rel2", "target"]


def test_hard_link_refused(mounted):
    (mounted.path / "f").write_bytes(b"x")
    expect_errno(errno.EPERM, os.link, mounted.path / "f", mounted.path / "g")
    assert os.listdir(mounted.path) == ["f"]
    assert os.stat(mounted.path / "f").st_nlink == 1


def test_fsync_and_close_make_contents_durable(any_chunk):
    mount, chunk = any_chunk
    path = mount.path / "durable"
    data = compressible(2 * chunk + 5, 12)
    with open(path, "wb") as f:
        f.write(data[:chunk])
        f.flush()
        assert os.getxattr(path, "user.nvfs.committed") == b"no"
        os.fsync(f.fileno())
        doc = manifest(mount, "durable")
        assert doc["size"] == chunk
        assert os.getxattr(path, "user.nvfs.committed") == b"yes"
        assert {ref[0] for ref in doc["chunks"]} <= chunk_objects(mount)
        f.write(data[chunk:])
    doc = manifest(mount, "durable")
    assert doc["size"] == len(data)
    assert sum(ref[1] for ref in doc["chunks"]) == len(data)
    assert {ref[0] for ref in doc["chunks"]} <= chunk_objects(mount)
    assert os.getxattr(path, "user.nvfs.committed") == b"yes"


def test_atomic_save_pattern(mounted):
    """write a temporary file, fsync it, rename it over the target, fsync the directory."""
    target = mounted.path / "ckpt.bin"
    target.write_bytes(b"old checkpoint")
    data = randbytes(6 * MIB + 1, 24)
    tmp = mounted.path / ".ckpt.bin.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        os.fdatasync(f.fileno())
    os.replace(tmp, target)
    dirfd = os.open(mounted.path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)
    assert os.listdir(mounted.path) == ["ckpt.bin"]
    assert manifest(mounted, "ckpt.bin")["size"] == len(data)
    mounted.remount()
    assert os.listdir(mounted.path) == ["ckpt.bin"]
    assert target.read_bytes() == data


def test_cp_preserves_mode_and_mtime(mounted, tmp_path):
    source = tmp_path / "src"
    data = randbytes(5 * MIB + 3, 25)
    source.write_bytes(data)
    os.chmod(source, 0o640)
    os.utime(source, ns=(981_173_106_789_000_000, 981_173_106_789_000_000))
    subprocess.run(["cp", "-p", str(source), str(mounted.path / "dst")], check=True)
    for _ in range(2):
        st = os.stat(mounted.path / "dst")
        assert st.st_mtime_ns == 981_173_106_789_000_000
        assert stat.S_IMODE(st.st_mode) == 0o640
        assert (mounted.path / "dst").read_bytes() == data
        mounted.remount()


def test_posix_fallocate_extends_with_zeros(mounted):
    path = mounted.path / "f"
    path.write_bytes(b"abc")
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, 100_000)
    finally:
        os.close(fd)
    assert os.path.getsize(path) == 100_000
    assert read_fresh(path) == b"abc" + bytes(100_000 - 3)


def test_statvfs(mounted):
    st = os.statvfs(mounted.path)
    assert st.f_bsize > 0 and st.f_frsize > 0
    assert st.f_blocks > 0
    assert 0 < st.f_bavail <= st.f_blocks
    assert st.f_namemax >= 254
    if not is_s3(mounted):  # a directory store reports the capacity of its file system
        backing = os.statvfs(mounted.source)
        assert st.f_blocks * st.f_frsize == backing.f_blocks * backing.f_frsize


def test_xattrs(mounted):
    path = mounted.path / "x"
    data = compressible(DEFAULT_CHUNK_SIZE * 3 // 2, 13)  # a chunk and a half
    path.write_bytes(data)
    wait_committed(path)
    names = set(os.listxattr(path))
    expected = {f"user.nvfs.{key}" for key in
                ("logical_size", "stored_size", "ratio", "codec", "engine", "chunks", "chunk_size",
                 "committed")}
    assert expected <= names

    def attr(key: str) -> str:
        return os.getxattr(path, f"user.nvfs.{key}").decode()

    assert int(attr("logical_size")) == len(data) == os.path.getsize(path)
    stored = int(attr("stored_size"))
    assert 0 < stored < len(data)
    assert float(attr("ratio")) > 1.5
    assert abs(float(attr("ratio")) - len(data) / stored) < 0.01
    assert attr("codec").endswith("zstd")
    assert attr("engine") in ("cpu", "gpu")
    assert int(attr("chunk_size")) == DEFAULT_CHUNK_SIZE
    assert int(attr("chunks")) == 2
    assert attr("committed") == "yes"
    assert stored == manifest(mounted, "x")["stored_size"]
    expect_errno(errno.ENODATA, os.getxattr, path, "user.nvfs.nonexistent")
    expect_errno(errno.ENOTSUP, os.setxattr, path, "user.foo", b"bar")
    expect_errno(errno.ENOTSUP, os.removexattr, path, "user.nvfs.ratio")
    # random data does not compress
    (mounted.path / "r").write_bytes(randbytes(MIB, 13))
    wait_committed(mounted.path / "r")
    assert float(os.getxattr(mounted.path / "r", "user.nvfs.ratio")) <= 1.0
    assert os.getxattr(mounted.path / "r", "user.nvfs.codec") == b"raw"
    mounted.remount()
    assert int(attr("logical_size")) == len(data)
    assert int(attr("stored_size")) == stored


def test_du_shows_stored_size(mounted):
    path = mounted.path / "compressible"
    data = compressible(8 * MIB, 14)
    path.write_bytes(data)
    for _ in range(2):
        du = subprocess.run(["du", "-B1", str(path)], capture_output=True, text=True, check=True)
        used = int(du.stdout.split()[0])
        assert 0 < used < len(data) // 2
        apparent = subprocess.run(["du", "-B1", "--apparent-size", str(path)], capture_output=True,
                                  text=True, check=True)
        assert int(apparent.stdout.split()[0]) == len(data)
        mounted.remount()


def test_remount_shows_same_tree(any_chunk):
    mount, chunk = any_chunk
    p = mount.path
    rng = random.Random(15)
    (p / "a" / "b" / "c").mkdir(parents=True)
    (p / "#x" / "##y").mkdir(parents=True)
    (p / "empty-dir").mkdir()
    files = {
        "top": compressible(chunk + 3, 15),
        "a/one": b"",
        "a/b/two": randbytes(3 * chunk, 16),
        "a/b/c/three": randbytes(1, 17),
        "#x/##y/#z": compressible(1000, 18),
        "#x/name with spaces": b"spaces",
        "ünï": "ünï".encode(),
    }
    for rel, data in files.items():
        (p / rel).write_bytes(data)
    os.chmod(p / "a" / "b" / "two", 0o600)
    os.chown(p / "a" / "b" / "c" / "three", 42, 43)
    os.symlink("a/b/two", p / "link")
    with open(p / "sparse", "wb") as f:
        f.seek(2 * chunk + rng.randrange(chunk))
        f.write(b"end")
    before = snapshot(p)
    assert len(before) == 15
    mount.remount()
    assert snapshot(p) == before
    for rel, data in files.items():
        assert (p / rel).read_bytes() == data
    mount.remount()
    assert snapshot(p) == before


# ----- chunk boundaries -----------------------------------------------------------------------


@pytest.mark.parametrize("offset,length", [
    (SMALL_CHUNK - 1, 2),
    (SMALL_CHUNK - 1, 1),
    (SMALL_CHUNK, 1),
    (SMALL_CHUNK, SMALL_CHUNK),
    (SMALL_CHUNK - 4096, 4096),
    (SMALL_CHUNK - 100, SMALL_CHUNK + 200),
    (1, 3 * SMALL_CHUNK),
    (3 * SMALL_CHUNK - 7, 2 * SMALL_CHUNK + 14),  # also extends the file
    (0, 4 * SMALL_CHUNK),
])
def test_chunk_boundary_writes(small, offset, length):
    path = small.path / "b"
    base = bytearray(compressible(4 * SMALL_CHUNK, 19))
    path.write_bytes(base)
    piece = randbytes(length, offset + length)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(piece)
    expected = base.copy()
    expected[offset : offset + length] = piece
    assert os.path.getsize(path) == len(expected)
    assert read_fresh(path) == expected
    doc = manifest(small, "b")
    assert doc["chunk_size"] == SMALL_CHUNK
    assert len(doc["chunks"]) == -(-len(expected) // SMALL_CHUNK)
    assert [ref[1] for ref in doc["chunks"][:-1]] == [SMALL_CHUNK] * (len(doc["chunks"]) - 1)
    small.remount()
    assert path.read_bytes() == expected


def test_chunk_boundary_reads(small):
    path = small.path / "b"
    data = randbytes(5 * SMALL_CHUNK + 10, 20)
    path.write_bytes(data)
    small.remount()
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        for boundary in range(SMALL_CHUNK, len(data), SMALL_CHUNK):
            for before, after in [(1, 1), (1, 0), (0, 1), (4096, 4096), (SMALL_CHUNK, SMALL_CHUNK),
                                  (100, 2 * SMALL_CHUNK + 5)]:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                start = boundary - before
                assert os.pread(fd, before + after, start) == data[start : boundary + after]
        assert os.pread(fd, len(data), 0) == data


def test_file_written_with_small_chunks_is_editable_at_default_chunk_size(mount_factory):
    mount = mount_factory("mixed")
    mount.mount("chunk_size=64k")
    path = mount.path / "f"
    data = bytearray(randbytes(4 * SMALL_CHUNK + 3, 21))
    path.write_bytes(data)
    mount.remount()  # now at the default chunk size
    assert path.read_bytes() == data
    with open(path, "r+b") as f:
        f.seek(SMALL_CHUNK - 2)
        f.write(b"ABCD")
        f.seek(len(data))
        f.write(b"!" * SMALL_CHUNK)
    data[SMALL_CHUNK - 2 : SMALL_CHUNK + 2] = b"ABCD"
    data += b"!" * SMALL_CHUNK
    assert read_fresh(path) == data
    assert manifest(mount, "f")["chunk_size"] == SMALL_CHUNK
    mount.remount()
    assert path.read_bytes() == data
    new = mount.path / "g"
    new.write_bytes(data)
    assert manifest(mount, "g")["chunk_size"] == DEFAULT_CHUNK_SIZE
