"""Damaged chunk objects in the backing store: reads fail with EIO and the log says where.

Every chunk object carries the SHA-256 of its uncompressed bytes; a flipped byte, a
missing object or a truncated one must never come back as file data, must not take the
daemon down, and must not hang the reader.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.fuse

MIB = 1 << 20
CHUNK = MIB
HEADER_SIZE = 64
NCHUNKS = 6
READ_DEADLINE = 20.0  # seconds; a read the daemon never answers is a failure, not a hung test


def _chunk_data(index: int) -> bytes:
    """Chunk ``index`` of the damaged file: even ones incompressible (raw), odd ones zstd."""
    if index % 2 == 0:
        return os.urandom(CHUNK)
    return os.urandom(CHUNK // 2) + bytes(CHUNK // 2)


@pytest.fixture
def damaged(mount_factory):
    """A store with ``sub/data.bin`` (NCHUNKS chunks plus a partial one) and ``other.bin``; unmounted."""
    mount = mount_factory(options=("chunk_size=1M",))
    mount.mount()
    data = b"".join(_chunk_data(i) for i in range(NCHUNKS)) + os.urandom(CHUNK // 3)
    other = os.urandom(3 * CHUNK + 777)
    (mount.path / "sub").mkdir()
    (mount.path / "sub" / "data.bin").write_bytes(data)
    (mount.path / "other.bin").write_bytes(other)
    mount.umount()
    yield mount, data, other
    mount.force_cleanup()  # also lazily unmounts a mount whose daemon died


def _refs(mount, name: str) -> list[list]:
    manifest = json.loads((mount.source / "tree" / name).read_bytes())
    assert manifest["chunk_size"] == CHUNK
    return manifest["chunks"]


def _chunk_path(mount, cid: str) -> Path:
    path = mount.source / "chunks" / cid[:2] / cid
    assert path.is_file(), f"chunk object {cid} is not where the store layout puts it"
    return path


def _errors(mount) -> str:
    return "\n".join(line for line in mount.log().splitlines() if " DEBUG " not in line)[-4000:]


def _run_readers(mount, readers: list[Callable[[], object]]) -> list[object]:
    """Run each reader in its own thread; return what each returned or raised.

    A read the daemon never answers would block its thread for good (and the test with
    it): past the deadline the daemon is killed, which aborts the connection and frees the
    readers, and the test fails.
    """
    pid = mount.daemon_pid()
    results: list[object] = [None] * len(readers)

    def run(slot: int) -> None:
        try:
            results[slot] = readers[slot]()
        except Exception as exc:
            results[slot] = exc

    threads = [threading.Thread(target=run, args=(slot,), daemon=True) for slot in range(len(readers))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + READ_DEADLINE
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in threads):
        os.kill(pid, signal.SIGKILL)
        for thread in threads:
            thread.join(timeout=READ_DEADLINE)
        pytest.fail(f"reads from the mount hung: the daemon never answered them\n{_errors(mount)}")
    for result in results:
        if isinstance(result, OSError) and result.errno in (errno.ENOTCONN, errno.ECONNABORTED):
            pytest.fail(f"the daemon died while serving reads: {result!r}\n{_errors(mount)}")
    return results


def _assert_eio(result: object) -> None:
    assert isinstance(result, OSError), f"a read of damaged data succeeded: {type(result)}"
    assert result.errno == errno.EIO, f"expected EIO, got {result!r}"


def _read_expect_eio(mount, path: Path) -> None:
    (result,) = _run_readers(mount, [path.read_bytes])
    _assert_eio(result)


def _pread(path: Path, length: int, offset: int) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return os.pread(f.fileno(), length, offset)


def _assert_logged(mount, name: str, index: int, cid: str) -> None:
    lines = [line for line in mount.log().splitlines() if name in line and cid in line]
    assert lines, f"no log line names {name} and chunk {cid}:\n{_errors(mount)}"
    assert any(re.search(rf"chunk\D{{0,3}}{index}\b", line) for line in lines), (
        f"no log line names chunk index {index}: {lines}"
    )


def _assert_rest_readable(mount, data: bytes, other: bytes, damaged_index: int) -> None:
    """The daemon is still serving: untouched files and chunks read back correctly."""
    path = mount.path / "sub" / "data.bin"
    good = [index for index in range(NCHUNKS) if index != damaged_index]
    readers = [(mount.path / "other.bin").read_bytes]
    readers += [lambda index=index: _pread(path, CHUNK, index * CHUNK) for index in good]
    results = _run_readers(mount, readers)
    assert results[0] == other
    for index, result in zip(good, results[1:], strict=True):
        assert result == data[index * CHUNK : (index + 1) * CHUNK], f"chunk {index}: {result!r:.200}"
    assert os.path.ismount(mount.mountpoint)


@pytest.mark.parametrize(("index", "codec"), [(2, "raw"), (3, "zstd")])
def test_flipped_byte_in_payload_is_eio(damaged, index, codec):
    mount, data, other = damaged
    ref = _refs(mount, "sub/data.bin")[index]
    assert ref[3] == codec
    path = _chunk_path(mount, ref[0])
    blob = bytearray(path.read_bytes())
    params_length = struct.unpack_from("<I", blob, 24)[0]
    payload_start = HEADER_SIZE + params_length
    position = payload_start + (len(blob) - payload_start) // 2
    blob[position] ^= 0x01
    path.write_bytes(bytes(blob))

    mount.mount()
    target = mount.path / "sub" / "data.bin"
    _read_expect_eio(mount, target)
    _assert_logged(mount, "/sub/data.bin", index, ref[0])
    _assert_rest_readable(mount, data, other, index)
    # The damage is persistent: a second read fails the same way (nothing bad was cached).
    (result,) = _run_readers(mount, [lambda: _pread(target, 4096, index * CHUNK + 100)])
    _assert_eio(result)


def test_missing_chunk_object_is_eio(damaged):
    mount, data, other = damaged
    ref = _refs(mount, "sub/data.bin")[1]
    _chunk_path(mount, ref[0]).unlink()

    mount.mount()
    _read_expect_eio(mount, mount.path / "sub" / "data.bin")
    _assert_logged(mount, "/sub/data.bin", 1, ref[0])
    _assert_rest_readable(mount, data, other, 1)


@pytest.mark.parametrize("keep", [HEADER_SIZE + 1000, 20, 0])
def test_truncated_chunk_object_is_eio(damaged, keep):
    mount, data, other = damaged
    ref = _refs(mount, "sub/data.bin")[4]
    path = _chunk_path(mount, ref[0])
    with open(path, "r+b") as f:
        f.truncate(keep)

    mount.mount()
    _read_expect_eio(mount, mount.path / "sub" / "data.bin")
    _assert_logged(mount, "/sub/data.bin", 4, ref[0])
    _assert_rest_readable(mount, data, other, 4)


def test_damaged_last_partial_chunk_is_eio(damaged):
    mount, data, other = damaged
    ref = _refs(mount, "sub/data.bin")[NCHUNKS]
    path = _chunk_path(mount, ref[0])
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 0x80
    path.write_bytes(bytes(blob))

    mount.mount()
    target = mount.path / "sub" / "data.bin"
    first, last = _run_readers(mount, [lambda: _pread(target, CHUNK, 0),
                                       lambda: _pread(target, 4096, NCHUNKS * CHUNK)])
    assert first == data[:CHUNK]
    _assert_eio(last)
    _assert_logged(mount, "/sub/data.bin", NCHUNKS, ref[0])
    (result,) = _run_readers(mount, [(mount.path / "other.bin").read_bytes])
    assert result == other


def test_concurrent_readers_of_a_damaged_chunk_all_get_eio(damaged):
    """Many readers, and the daemon's read-ahead, fetching one bad chunk at once: every read of it
    fails with EIO, none hangs, and the daemon keeps serving."""
    mount, data, other = damaged
    bad = 3
    ref = _refs(mount, "sub/data.bin")[bad]
    _chunk_path(mount, ref[0]).unlink()
    mount.mount()
    pid = mount.daemon_pid()
    path = mount.path / "sub" / "data.bin"
    rounds = 12
    start = threading.Barrier(8, timeout=READ_DEADLINE)

    def reader(sequential: bool) -> list[object]:
        outcomes: list[object] = []
        with open(path, "rb", buffering=0) as f:
            start.wait()
            for _round in range(rounds):
                # Drop the file's pages so that reads of good chunks reach the daemon again
                # and start its read-ahead of the bad one.
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                if sequential:
                    before = os.pread(f.fileno(), CHUNK, (bad - 1) * CHUNK)
                    assert before == data[(bad - 1) * CHUNK : bad * CHUNK]
                try:
                    outcomes.append(os.pread(f.fileno(), CHUNK, bad * CHUNK))
                except OSError as exc:
                    outcomes.append(exc)
        return outcomes

    results = _run_readers(mount, [lambda sequential=number % 2 == 1: reader(sequential)
                                   for number in range(8)])
    for result in results:
        assert isinstance(result, list), f"a reader failed: {result!r}"
        assert len(result) == rounds
        for outcome in result:
            _assert_eio(outcome)
    assert mount.daemon_pid() == pid
    _assert_rest_readable(mount, data, other, bad)
