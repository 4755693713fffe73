"""A seeded random exerciser: the same operations on an nvfs file and on a plain reference file.

Every read is compared with the reference, and so is the whole file at the end, after a
remount. The page cache is dropped now and then so that reads reach the daemon instead of
being answered by the kernel. On a mismatch the message lists the operations that led there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import signal
import threading
from dataclasses import dataclass

import pytest

from nvfs.store import DEFAULT_CHUNK_SIZE

pytestmark = pytest.mark.fuse

KIB = 1 << 10
MIB = 1 << 20


@dataclass(frozen=True)
class Variant:
    options: tuple[str, ...]
    chunk: int
    max_size: int  # the file is kept below this size
    max_write: int  # largest single write
    steps: int


SMALL = Variant(("chunk_size=64k",), 64 * KIB, max_size=3 * MIB // 2, max_write=300 * KIB, steps=800)
DEFAULT = Variant((), DEFAULT_CHUNK_SIZE, max_size=6 * DEFAULT_CHUNK_SIZE,
                  max_write=DEFAULT_CHUNK_SIZE * 9 // 4, steps=200)
# tight limits: partly written chunks are stored early and rewritten, few are cached
PRESSURE = Variant(("chunk_size=64k", "max_dirty=1M", "max_inflight=1M", "cache_size=1M", "readahead=0"),
                   64 * KIB, max_size=4 * MIB, max_write=1 * MIB, steps=500)
# no chunk cache at all: every read, and every kernel read-ahead, goes to the store
NOCACHE = dataclasses.replace(PRESSURE, options=("chunk_size=64k", "max_dirty=1M", "max_inflight=1M",
                                                 "cache_size=0", "readahead=0"))

CASES = [
    *(pytest.param(SMALL, seed, "dir", id=f"chunk64k-seed{seed}") for seed in (1, 2, 3, 4)),
    *(pytest.param(DEFAULT, seed, "dir", id=f"chunk-default-seed{seed}") for seed in (1, 2, 3)),
    *(pytest.param(PRESSURE, seed, "dir", id=f"pressure-seed{seed}") for seed in (1, 2)),
    pytest.param(NOCACHE, 1, "dir", id="nocache-seed1"),
    pytest.param(dataclasses.replace(SMALL, steps=300), 5, "s3", id="s3-chunk64k-seed5",
                 marks=pytest.mark.s3),
]


def daemon_pids(mount) -> list[int]:
    """Pids of the nvfs daemons serving ``mount`` (found by their command line)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"nvfs" in argv and b"mount" in argv and os.fsencode(mount.source) in argv:
            pids.append(int(entry))
    return pids


@contextlib.contextmanager
def watchdog(mount, seconds: float):
    """Kill the daemon if the body takes longer than ``seconds``: a hung request fails the test
    (with ENOTCONN in the body) instead of blocking the whole test run."""
    fired = threading.Event()

    def kill() -> None:
        fired.set()
        for pid in daemon_pids(mount):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    timer = threading.Timer(seconds, kill)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        assert not fired.is_set(), f"nvfs did not answer within {seconds:.0f}s: the daemon was killed"


class Exerciser:
    """Applies random operations to ``mnt`` (on nvfs) and ``ref`` (a plain file) alike."""

    def __init__(self, variant: Variant, seed: int, mnt: str, ref: str) -> None:
        self.v = variant
        self.rng = random.Random(seed)
        self.mnt, self.ref = mnt, ref
        self.history: list[str] = []
        self.fd_mnt = os.open(mnt, os.O_RDWR | os.O_CREAT, 0o644)
        self.fd_ref = os.open(ref, os.O_RDWR | os.O_CREAT, 0o644)

    # ----- bookkeeping --------------------------------------------------------------------

    def fail_message(self, what: str) -> str:
        return f"{what}\nlast operations (of {len(self.history)}):\n  " + "\n  ".join(self.history[-25:])

    def size(self) -> int:
        return os.fstat(self.fd_ref).st_size

    def check_size(self) -> None:
        got, want = os.fstat(self.fd_mnt).st_size, self.size()
        assert got == want, self.fail_message(f"size {got}, expected {want}")

    def compare(self, offset: int, length: int, fd: int | None = None) -> None:
        got = os.pread(self.fd_mnt if fd is None else fd, length, offset)
        want = os.pread(self.fd_ref, length, offset)
        if got != want:
            common = min(len(got), len(want))
            first = next((i for i in range(common) if got[i] != want[i]), common)
            raise AssertionError(self.fail_message(
                f"pread({length}, {offset}): {len(got)} bytes, expected {len(want)}; "
                f"first difference at file offset {offset + first}"))

    def compare_all(self) -> None:
        self.drop_cache()
        self.check_size()
        self.compare(0, self.size() + 1)

    # ----- choices --------------------------------------------------------------------------

    def offset(self) -> int:
        rng, size, chunk = self.rng, self.size(), self.v.chunk
        kind = rng.random()
        if kind < 0.3:
            return rng.randrange(0, size + 1)
        if kind < 0.6:  # near a chunk boundary
            boundary = chunk * rng.randrange(0, self.v.max_size // chunk + 1)
            return max(0, boundary + rng.randint(-3, 3) * rng.choice([1, 1, 4096]))
        if kind < 0.75:
            return size  # append
        return rng.randrange(0, self.v.max_size)  # anywhere, often beyond EOF

    def length(self) -> int:
        rng, chunk = self.rng, self.v.chunk
        kind = rng.random()
        if kind < 0.3:
            return rng.randint(1, 300)
        if kind < 0.6:
            return rng.randint(1, chunk)
        if kind < 0.75:
            return rng.choice([chunk - 1, chunk, chunk + 1, 2 * chunk])
        return rng.randint(1, self.v.max_write)

    def payload(self, length: int) -> bytes:
        kind = self.rng.random()
        if kind < 0.6:
            return self.rng.randbytes(length)
        if kind < 0.8:
            return bytes(length)  # zeros: dedup against holes and other zero chunks
        pattern = self.rng.randbytes(self.rng.randint(1, 16))
        return (pattern * (length // len(pattern) + 1))[:length]

    # ----- operations -------------------------------------------------------------------------

    def op_write(self) -> None:
        offset = min(self.offset(), self.v.max_size - 1)
        length = max(1, min(self.length(), self.v.max_size - offset))
        data = self.payload(length)
        self.history.append(f"pwrite(offset={offset}, length={length})")
        assert os.pwrite(self.fd_mnt, data, offset) == length, self.fail_message("short write")
        os.pwrite(self.fd_ref, data, offset)

    def op_truncate(self, by_path: bool = False) -> None:
        rng, size, chunk = self.rng, self.size(), self.v.chunk
        kind = rng.random()
        if kind < 0.4:
            new = rng.randrange(0, size + 1)  # shrink
        elif kind < 0.7:
            new = rng.randrange(size, self.v.max_size + 1)  # grow
        elif kind < 0.9:
            new = max(0, chunk * rng.randrange(0, self.v.max_size // chunk + 1) + rng.randint(-2, 2))
        else:
            new = 0
        new = min(new, self.v.max_size)
        if by_path:
            self.history.append(f"truncate(path, {new})  # size was {size}")
            os.truncate(self.mnt, new)
            os.truncate(self.ref, new)
        else:
            self.history.append(f"ftruncate({new})  # size was {size}")
            os.ftruncate(self.fd_mnt, new)
            os.ftruncate(self.fd_ref, new)

    def op_read(self) -> None:
        offset = self.rng.randrange(0, self.size() + self.v.chunk + 1)
        length = self.length()
        self.history.append(f"pread(offset={offset}, length={length})")
        self.compare(offset, length)

    def op_read_other_fd(self) -> None:
        offset = self.rng.randrange(0, self.size() + 1)
        length = self.length()
        self.history.append(f"pread on a second fd(offset={offset}, length={length})")
        fd = os.open(self.mnt, os.O_RDONLY)
        try:
            self.compare(offset, length, fd)
        finally:
            os.close(fd)

    def op_write_other_fd(self) -> None:
        """Write through a second descriptor; its close commits while the first stays open."""
        offset = min(self.offset(), self.v.max_size - 1)
        length = max(1, min(self.length(), self.v.max_size - offset))
        data = self.payload(length)
        self.history.append(f"pwrite on a second fd(offset={offset}, length={length}) + close")
        fd = os.open(self.mnt, os.O_WRONLY)
        try:
            assert os.pwrite(fd, data, offset) == length, self.fail_message("short write")
        finally:
            os.close(fd)
        os.pwrite(self.fd_ref, data, offset)

    def op_rename(self) -> None:
        """Rename the open file (back and forth between two names)."""
        other = self.mnt[:-4] if self.mnt.endswith(".alt") else self.mnt + ".alt"
        self.history.append(f"rename to {os.path.basename(other)}")
        os.rename(self.mnt, other)
        self.mnt = other

    def op_reopen(self) -> None:
        self.history.append("close + reopen")
        os.close(self.fd_mnt)
        self.fd_mnt = os.open(self.mnt, os.O_RDWR)

    def op_fsync(self) -> None:
        self.history.append("fsync")
        os.fsync(self.fd_mnt)

    def drop_cache(self) -> None:
        os.posix_fadvise(self.fd_mnt, 0, 0, os.POSIX_FADV_DONTNEED)

    def op_drop_cache(self) -> None:
        self.history.append("drop page cache")
        self.drop_cache()

    def step(self) -> None:
        ops = [
            (self.op_write, 34),
            (self.op_read, 25),
            (self.op_truncate, 10),
            (lambda: self.op_truncate(by_path=True), 3),
            (self.op_read_other_fd, 5),
            (self.op_write_other_fd, 4),
            (self.op_rename, 3),
            (self.op_reopen, 6),
            (self.op_fsync, 5),
            (self.op_drop_cache, 12),
        ]
        op = self.rng.choices([fn for fn, _ in ops], weights=[weight for _, weight in ops])[0]
        op()
        self.check_size()

    def close(self) -> None:
        os.close(self.fd_mnt)
        os.close(self.fd_ref)


@pytest.mark.parametrize("variant,seed,backend", CASES)
def test_random_operations_match_reference(mount_factory, tmp_path, variant: Variant, seed: int,
                                           backend: str):
    mount = mount_factory("x", options=variant.options, backend=backend)
    mount.mount()
    ref = str(tmp_path / "reference")
    with watchdog(mount, 120):
        ex = Exerciser(variant, seed, str(mount.path / "file"), ref)
        try:
            for number in range(variant.steps):
                ex.step()
                if number % 50 == 49:
                    ex.history.append("compare all")
                    ex.compare_all()
            ex.compare_all()
        finally:
            ex.close()
        mnt = ex.mnt  # the exerciser may have renamed it
        assert os.listdir(mount.path) == [os.path.basename(mnt)]
        with open(ref, "rb") as f:
            expected = f.read()
        assert os.path.getsize(mnt) == len(expected)
        mount.remount()
        assert os.listdir(mount.path) == [os.path.basename(mnt)]
        assert os.path.getsize(mnt) == len(expected)
        with open(mnt, "rb") as f:
            got = f.read()
        assert got == expected, ex.fail_message("contents differ after remount")

        # and carry on from the remounted state for a while
        ex = Exerciser(variant, seed + 1000, mnt, ref)
        ex.history.append("(after remount)")
        try:
            for _ in range(variant.steps // 4):
                ex.step()
            ex.compare_all()
        finally:
            ex.close()
        mount.remount()
        with open(ex.mnt, "rb") as f, open(ref, "rb") as g:
            assert f.read() == g.read(), ex.fail_message("contents differ after the second remount")
