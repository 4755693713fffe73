"""nvfs on a real S3 server (SeaweedFS): shared buckets, faults, damaged chunks, mount errors, secrets.

* Two mounts of one bucket: what one mount commits shows up on the other within
  ``metadata_ttl`` plus the kernel's attribute timeout, and a reader there never sees a torn file.
* The S3 server dies in the middle of a large write: the writer gets EIO in bounded time, the
  store holds no torn file, and the same mount works again once the server is back.
* A chunk object deleted or corrupted behind nvfs's back reads as EIO, and the log says where.
* Mount-time errors (missing bucket, unreachable endpoint, wrong or no credentials) are one line
  on stderr and a non-zero exit, in bounded time.
* The secret key never shows in the daemon's command line or its log.

Waiting for a TTL is done by polling the observable condition against a deadline, never by
sleeping for a guessed time. ``metadata_ttl=1`` keeps those waits short.
"""

from __future__ import annotations

import concurrent.futures
import errno
import hashlib
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nvfs.store import DEFAULT_CHUNK_SIZE
from nvfs.testing.seaweed import SECRET_KEY, SeaweedServer, free_port
from tests.conftest import NVFS, Mount

pytestmark = [pytest.mark.fuse, pytest.mark.s3]

MIB = 1 << 20
TTL = 1.0  # -o metadata_ttl of the shared-bucket tests
ATTR_TIMEOUT = 1.0  # entry and attribute timeout nvfs hands the kernel (nvfs/fuse/operations.py)
VISIBLE_DEADLINE = TTL + ATTR_TIMEOUT + 5.0  # seconds until a change on one mount shows on the other
MOUNT_ERROR_DEADLINE = 60.0  # seconds a failing `nvfs mount` may take to give up
WRITER_DEADLINE = 120.0  # seconds a writer whose S3 server died may take to get its error
# ... with default options: one retry cycle of nvfs's S3 client (it backs off about 25 s on average,
# at most 51 s, before it gives a request up) plus slack.
FAST_EIO_DEADLINE = 60.0


# ----- helpers --------------------------------------------------------------------------------


def _poll(condition: Callable[[], object], timeout: float, what: str | Callable[[], str]) -> object:
    """Call ``condition`` until it returns something truthy; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.1f} s: {what if isinstance(what, str) else what()}")
        time.sleep(0.05)  # poll interval, not a synchronisation point


def _read_or_none(path: Path) -> bytes | None:
    """The file's bytes, or None while it does not exist (yet)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _shared_pair(mount_factory) -> tuple[Mount, Mount]:
    """Mounts A and B of one bucket and prefix, both mounted, listings refreshed after ``TTL``."""
    options = (f"metadata_ttl={TTL:g}",)
    first = mount_factory("a", options, backend="s3")
    second = mount_factory("b", options, backend="s3")  # makes a bucket of its own, which it will not use
    second.url, second.bucket = first.url, first.bucket
    first.mount()
    second.mount()
    return first, second


def _chunk_ids(mount: Mount, name: str) -> list[str]:
    manifest = json.loads(mount.read_object(f"tree/{name}"))
    return [ref[0] for ref in manifest["chunks"] if ref is not None]


def _chunk_key(cid: str) -> str:
    return f"chunks/{cid[:2]}/{cid}"


def _log_errors(mount: Mount, lines: int = 12) -> str:
    """The last error and warning lines of the daemon log (not multi-line debug output), shortened."""
    found = [line[:300] for line in mount.log().splitlines()
             if re.match(r"\d{4}-\d\d-\d\d [\d:,]+ \d+ (ERROR|WARNING|CRITICAL) ", line)]
    return "\n".join(found[-lines:])


# ----- two mounts of one bucket ---------------------------------------------------------------------


def test_changes_on_one_mount_show_on_the_other(mount_factory):
    a, b = _shared_pair(mount_factory)
    assert os.listdir(b.path) == []  # B has listed the root: from now on it trusts that for TTL s

    # A new file, written and closed on A, is listed and readable bit-exact on B.
    first = os.urandom(5 * MIB + 3)
    (a.path / "ckpt.bin").write_bytes(first)
    _poll(lambda: "ckpt.bin" in os.listdir(b.path), VISIBLE_DEADLINE, "ckpt.bin listed on B")
    assert (b.path / "ckpt.bin").read_bytes() == first
    assert (b.path / "ckpt.bin").stat().st_size == len(first)

    # mkdir on A (with a file inside) appears on B.
    (a.path / "run").mkdir()
    inner = os.urandom(MIB // 2)
    (a.path / "run" / "step-1.bin").write_bytes(inner)
    _poll(lambda: (b.path / "run").is_dir(), VISIBLE_DEADLINE, "directory run/ on B")
    assert _poll(lambda: _read_or_none(b.path / "run" / "step-1.bin"), VISIBLE_DEADLINE,
                 "run/step-1.bin on B") == inner

    # Deleted on A: gone from B's listing, and opening it on B fails with ENOENT.
    (a.path / "gone.bin").write_bytes(b"short-lived")
    gone = _poll(lambda: _read_or_none(b.path / "gone.bin"), VISIBLE_DEADLINE, "gone.bin on B")
    assert gone == b"short-lived"
    (a.path / "gone.bin").unlink()
    _poll(lambda: "gone.bin" not in os.listdir(b.path), VISIBLE_DEADLINE, "gone.bin gone from B's listing")
    _poll(lambda: not (b.path / "gone.bin").exists(), VISIBLE_DEADLINE, "gone.bin not found on B")
    with pytest.raises(FileNotFoundError):
        (b.path / "gone.bin").read_bytes()
    assert sorted(os.listdir(b.path)) == ["ckpt.bin", "run"]

    # Replaced on A with contents of another size: B reads the new contents after the TTL, the
    # old ones or the new ones before that, nothing else; stat on B gives the new size.
    second = os.urandom(3 * MIB + 17)
    with open(a.path / "ckpt.bin", "wb") as f:
        f.write(second)
    seen: list[str] = []

    def describe(data: bytes) -> str:
        if data == second:
            return "new"
        if data == first:
            return "old"
        if data[: len(second)] == second and not any(data[len(second) :]):
            return f"new + {len(data) - len(second)} zero bytes"
        return f"other ({len(data)} bytes)"

    def replaced() -> bool:
        seen.append(describe((b.path / "ckpt.bin").read_bytes()))
        return seen[-1] == "new"

    def failure() -> str:
        path = b.path / "ckpt.bin"
        daemon = os.getxattr(path, "user.nvfs.logical_size").decode()
        kinds = sorted(set(seen), key=seen.index)
        return (f"the new contents of ckpt.bin read on B; B read (in order): {kinds}; stat on B: "
                f"{path.stat().st_size} bytes, B's daemon says {daemon}, A wrote {len(second)}")

    _poll(replaced, VISIBLE_DEADLINE, failure)
    assert all(kind in ("old", "new") for kind in seen), seen
    assert (b.path / "ckpt.bin").stat().st_size == len(second)

    # Nothing B did made it write to the store: both still agree after remounting B.
    b.remount()
    assert sorted(os.listdir(b.path)) == ["ckpt.bin", "run"]
    assert (b.path / "run" / "step-1.bin").read_bytes() == inner
    assert (b.path / "ckpt.bin").read_bytes() == second


def test_reader_on_other_mount_never_sees_a_torn_file(mount_factory):
    """A rewrites a 40 MiB file in place, again and again; every whole read on B is one version."""
    a, b = _shared_pair(mount_factory)
    size = 40 * MIB
    base = bytearray(os.urandom(size))
    versions = []
    for number in range(4):
        for offset in range(0, size, DEFAULT_CHUNK_SIZE):  # every chunk differs from every other version's
            base[offset : offset + 8] = number.to_bytes(8, "little")
        versions.append(bytes(base))
    digests = {_digest(data): number for number, data in enumerate(versions)}
    assert len(digests) == len(versions)

    (a.path / "model.bin").write_bytes(versions[0])
    _poll(lambda: (b.path / "model.bin").exists(), VISIBLE_DEADLINE, "model.bin on B")

    writer_done = threading.Event()
    writer_errors: list[BaseException] = []

    def rewrite() -> None:
        try:
            for data in versions[1:] * 2:
                with open(a.path / "model.bin", "wb") as f:
                    f.write(data)
        except BaseException as exc:
            writer_errors.append(exc)
        finally:
            writer_done.set()

    writer = threading.Thread(target=rewrite)
    writer.start()
    reads: list[int | str] = []
    try:
        for _ in range(300):  # bounded: the writer is done well before this
            data = (b.path / "model.bin").read_bytes()
            reads.append(digests.get(_digest(data), f"torn ({len(data)} bytes)"))
            if writer_done.is_set() and len(reads) >= 3:
                break
    finally:
        writer.join(timeout=120)
    assert not writer.is_alive(), "the writer on A did not finish"
    assert not writer_errors, writer_errors
    torn = [r for r in reads if isinstance(r, str)]
    assert not torn, f"B read torn versions: {reads}"
    print(f"B read model.bin {len(reads)} times while A rewrote it; versions seen: {sorted(set(reads))}")
    # After the last rewrite B converges on the last version.
    last = _digest(versions[-1])
    _poll(lambda: _digest((b.path / "model.bin").read_bytes()) == last, VISIBLE_DEADLINE,
          "B reads the last version")


# ----- the S3 server fails under a large write ---------------------------------------------------

# The writer: rewrites PATH with TOTAL bytes in 1 MiB writes. After FIRST bytes it reports
# "ready" and waits for "go" on stdin (the test stops the server in between); at the end it
# reports one JSON line: how many bytes write() accepted and which call failed with which errno.
_WRITER = r"""
import json, os, sys
path, total, first = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
piece = 1 << 20
written, failed, code = 0, None, None
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
try:
    while written < total:
        if written == first:
            print("ready", flush=True)
            sys.stdin.readline()
        written += os.write(fd, os.urandom(piece))
except OSError as exc:
    failed, code = "write", exc.errno
try:
    os.close(fd)
except OSError as exc:
    if failed is None:
        failed, code = "close", exc.errno
print(json.dumps({"written": written, "failed": failed, "errno": code}), flush=True)
"""


def _read_line(stream, timeout: float, what: str) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, f"no {what} from the writer within {timeout:.0f} s"
    return stream.readline().strip()


@pytest.fixture
def outage(tmp_path):
    """A SeaweedFS server of this test's own (stopping it disturbs no other test) and a mount on it.

    Yields the server and ``make(*options, share=None)``, which returns a mounted :class:`Mount` of a
    new bucket, or of the bucket and prefix of the mount ``share``. At the end the server is
    brought back if a test left it stopped, so that the mount drains and unmounts quickly.
    """
    server = SeaweedServer(tmp_path / "weed")
    server.start()
    made: list[Mount] = []

    def make(*options: str, share: Mount | None = None) -> Mount:
        root = tmp_path / f"m{len(made)}"
        root.mkdir()
        mount = Mount(root, ("metadata_ttl=1", *options), s3=server)
        if share is not None:
            mount.url, mount.bucket = share.url, share.bucket
        made.append(mount)
        mount.mount()
        return mount

    try:
        yield server, make
    finally:
        try:
            if not server.running:
                server.start()
        finally:
            for mount in made:
                mount.force_cleanup()
            server.close(timeout=0)


class _Writer:
    """The writer child: rewrites ``path`` with ``total`` bytes; the S3 server dies after ``first``."""

    def __init__(self, path: Path, total: int, first: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(total), str(first)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def wait_ready(self) -> None:
        assert self.proc.stdout is not None
        assert _read_line(self.proc.stdout, 60, "'ready'") == "ready"

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def report(self) -> dict:
        """What the finished writer says: bytes written, the call that failed and its errno."""
        assert self.proc.stdout is not None
        lines = self.proc.stdout.read().strip().splitlines()
        assert lines, f"the writer exited {self.proc.returncode} without a report"
        return json.loads(lines[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_server_dies_during_large_writes(outage):
    """Two mounts on one S3 server each rewrite big.bin with 200 MiB; the server dies after 16 MiB.

    * ``default``: default options, so up to max_inflight (256 MiB) of chunks are on their way.
      One failed chunk dooms the file, so the writer should get EIO after about one retry cycle
      of the S3 client (FAST_EIO_DEADLINE), not after every queued chunk has waited out a retry
      cycle of its own.
    * ``bounded``: max_inflight=8M, so the writer blocks on uploads and the outage surfaces in
      the middle of the write; it must get EIO within WRITER_DEADLINE.

    Then, with the server back on the same data and ports: the store holds each big.bin's version
    from before, whole; and each mount works again -- a new file, and big.bin written again (what a
    checkpoint saver does after an EIO) are stored and survive a remount.
    """
    server, make = outage
    mounts = {"default": make(), "bounded": make("max_inflight=8M")}
    before = {}
    for name, mount in mounts.items():
        before[name] = os.urandom(6 * MIB + 5)
        (mount.path / "big.bin").write_bytes(before[name])
        (mount.path / "other.bin").write_bytes(b"untouched")

    writers = {name: _Writer(mount.path / "big.bin", 200 * MIB, 16 * MIB) for name, mount in mounts.items()}
    finished: dict[str, float] = {}  # writer -> seconds from the server's death to its exit
    problems: list[str] = []
    try:
        for writer in writers.values():
            writer.wait_ready()
        server.stop(timeout=0)  # SIGKILL: the endpoint is gone, connections are refused
        began = time.monotonic()
        for writer in writers.values():
            writer.go()

        def watch(wanted: list[str], until: float) -> None:
            """Note when each writer exits; return once those ``wanted`` have, or at ``until``."""
            while True:
                for name, writer in writers.items():
                    if name not in finished and writer.proc.poll() is not None:
                        finished[name] = time.monotonic() - began
                if all(name in finished for name in wanted) or time.monotonic() >= until:
                    return
                time.sleep(0.05)  # poll interval

        watch(["bounded"], began + WRITER_DEADLINE)
        if "bounded" not in finished:
            pytest.fail(f"max_inflight=8M: the writer got no error within {WRITER_DEADLINE:.0f} s of the S3 "
                        f"server dying (the mount hangs)\n{_log_errors(mounts['bounded'])}")
        watch(["default"], began + FAST_EIO_DEADLINE)
        slow = "default" not in finished
        log_so_far = _log_errors(mounts["default"], 6)
        # The writers sit in write() or close() until nvfs answers (a FUSE flush cannot be
        # killed): bring the server back, same data and ports, so a slow one finishes.
        server.start()
        watch(list(writers), time.monotonic() + WRITER_DEADLINE)
        assert set(finished) == set(writers), f"writers still running after the server came back: {finished}"
        if slow:
            problems.append(
                f"default options: the writer got no error within {FAST_EIO_DEADLINE:.0f} s of the S3 server "
                f"dying (it finished {finished['default']:.0f} s after, once the server was back); "
                f"log until then:\n{log_so_far}")
    finally:
        if not server.running:
            server.start()  # so that the writers can be reaped
        for writer in writers.values():
            writer.kill()
    reports = {name: writer.report() for name, writer in writers.items()}
    for name, report in reports.items():
        print(f"{name}: the writer got errno {report['errno']} from {report['failed']}() "
              f"{finished[name]:.0f} s after the S3 server died ({report['written'] >> 20} MiB written)")
        assert report["failed"] in ("write", "close") and report["errno"] == errno.EIO, (name, report)

    for name, mount in mounts.items():
        # The store holds big.bin's version from before, whole: a second mount reads it.
        fresh = make(share=mount)
        assert sorted(os.listdir(fresh.path)) == ["big.bin", "other.bin"]
        torn = (fresh.path / "big.bin").read_bytes() != before[name]
        assert not torn, f"{name}: the store holds a torn big.bin"
        fresh.umount()

    after, retry = os.urandom(9 * MIB + 1), os.urandom(5 * MIB + 7)
    for name, mount in mounts.items():
        # The same mount works again: new files are stored and survive a remount ...
        (mount.path / "after.bin").write_bytes(after)
        assert (mount.path / "after.bin").read_bytes() == after
        (mount.path / "other.bin").write_bytes(b"rewritten")
        # ... and so does writing big.bin again.
        try:
            (mount.path / "big.bin").write_bytes(retry)
        except OSError as exc:
            problems.append(f"{name}: writing big.bin again on the same mount after the S3 server came "
                            f"back failed: {exc!r}\n{_log_errors(mount, 4)}")
        mount.remount()
        assert (mount.path / "after.bin").read_bytes() == after
        assert (mount.path / "other.bin").read_bytes() == b"rewritten"
        big = (mount.path / "big.bin").read_bytes()
        assert big in (retry, before[name]), f"{name}: big.bin is torn after the remount"
        if big != retry and not any(problem.startswith(f"{name}: writing big.bin") for problem in problems):
            problems.append(f"{name}: big.bin written again after the outage is lost at the remount")
    assert not problems, "\n".join(problems)


# ----- chunks damaged behind nvfs's back ------------------------------------------------------------


@pytest.mark.parametrize("damage", ["deleted", "corrupted"])
def test_damaged_chunk_reads_as_eio_and_is_logged(mount_factory, damage):
    mount = mount_factory(options=("chunk_size=1M",), backend="s3")
    mount.mount()
    data = os.urandom(4 * MIB + 100)
    (mount.path / "weights.bin").write_bytes(data)
    mount.umount()

    ids = _chunk_ids(mount, "weights.bin")
    assert len(ids) == 5 and len(set(ids)) == 5
    victim = ids[2]
    key = _chunk_key(victim)
    if damage == "deleted":
        mount.delete_object(key)
    else:
        blob = bytearray(mount.read_object(key))
        blob[len(blob) // 2] ^= 0x01
        mount.write_object(key, bytes(blob))

    mount.mount()
    path = mount.path / "weights.bin"
    with open(path, "rb") as f:
        assert f.read(2 * MIB) == data[: 2 * MIB]  # chunks before the damaged one read fine
        with pytest.raises(OSError) as caught:
            f.read(MIB)
        assert caught.value.errno == errno.EIO
    with open(path, "rb") as f:  # the chunk after it is fine too
        f.seek(3 * MIB)
        assert f.read(MIB) == data[3 * MIB : 4 * MIB]
    with pytest.raises(OSError) as caught:
        path.read_bytes()
    assert caught.value.errno == errno.EIO
    log = _log_errors(mount)
    lines = [line for line in mount.log().splitlines() if victim in line and " ERROR " in line]
    assert lines, f"the log does not name chunk {victim}:\n{log}"
    assert any("/weights.bin" in line for line in lines), f"the log does not name the file:\n{log}"
    # The mount is still alive.
    (mount.path / "ok.bin").write_bytes(b"fine")
    assert (mount.path / "ok.bin").read_bytes() == b"fine"


# ----- errors at mount time ----------------------------------------------------------------------------


def test_mount_errors(mount_factory, seaweed):
    """Each failing mount says why in one line on stderr and exits non-zero, within a deadline.

    The cases run side by side (each on a mountpoint of its own): the unreachable endpoint takes
    the S3 client's whole retry cycle to give up.
    """
    endpoint = f"endpoint_url={seaweed.endpoint_url}"
    env = seaweed.environ()
    bare = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    wrong_secret = {**env, "AWS_SECRET_ACCESS_KEY": "wrong-secret"}
    no_credentials = {"AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
                      "AWS_CONFIG_FILE": "/nonexistent/config", "AWS_EC2_METADATA_DISABLED": "true"}
    nothing_listening = f"endpoint_url=http://127.0.0.1:{free_port()}"
    cases = {
        # name: (url, -o options, environment on top of os.environ, what stderr must say)
        "missing bucket": ("s3://nvfs-no-such-bucket/store", endpoint, env,
                           "bucket 'nvfs-no-such-bucket' does not exist"),
        # SeaweedFS checks signatures against its identity file: SignatureDoesNotMatch (403).
        "wrong secret key": (None, endpoint, wrong_secret, "access denied"),
        "unknown access key": (None, endpoint, {**env, "AWS_ACCESS_KEY_ID": "nobody"}, "access denied"),
        "no credentials": (None, endpoint, no_credentials, "no AWS credentials"),
        "nothing listening": (None, nothing_listening, env, "cannot reach the endpoint"),
    }
    mounts = {name: mount_factory(f"case{number}", backend="s3") for number, name in enumerate(cases)}

    def attempt(name: str) -> tuple[subprocess.CompletedProcess, float]:
        url, options, extra, _ = cases[name]
        mount = mounts[name]
        command = [*NVFS, "mount", url or mount.url, str(mount.path), "-o", options]
        began = time.monotonic()
        result = subprocess.run(command, capture_output=True, text=True, timeout=MOUNT_ERROR_DEADLINE,
                                env={**bare, **extra})
        return result, time.monotonic() - began

    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
        outcomes = dict(zip(cases, pool.map(attempt, cases), strict=True))
    problems = []
    for name, (result, took) in outcomes.items():
        stderr = result.stderr.strip()
        expected = cases[name][3]
        if result.returncode == 0 or mounts[name].is_in_mount_table():
            problems.append(f"{name}: the mount succeeded")
        elif len(stderr.splitlines()) != 1 or "Traceback" in stderr or expected not in stderr:
            problems.append(f"{name}: stderr is not one line saying {expected!r}:\n{stderr}")
        elif SECRET_KEY in stderr or "wrong-secret" in stderr:
            problems.append(f"{name}: stderr shows the secret key: {stderr}")
        print(f"{name}: exit {result.returncode} after {took:.1f} s: {stderr}")
    assert not problems, "\n".join(problems)

    # None of this touched the bucket: it mounts fine, and empty.
    mount = mounts["wrong secret key"]
    mount.mount()
    assert os.listdir(mount.path) == []
    assert mount.keys("tree/") == ["tree/#dir"]


# ----- secrets ------------------------------------------------------------------------------------------


def test_secret_key_never_shown(mount_factory):
    mount = mount_factory(backend="s3")
    mount.mount()  # log_level=debug
    data = os.urandom(3 * MIB)
    (mount.path / "a.bin").write_bytes(data)
    (mount.path / "d").mkdir()
    os.rename(mount.path / "a.bin", mount.path / "d" / "a.bin")
    mount.remount()
    assert (mount.path / "d" / "a.bin").read_bytes() == data
    pid = mount.daemon_pid()
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert SECRET_KEY.encode() not in cmdline, cmdline
    with open("/proc/self/mountinfo") as table:
        entries = [line for line in table if str(mount.path) in line]
    assert entries and not any(SECRET_KEY in line for line in entries), entries
    mount.umount()
    log = mount.log()
    assert "mounted s3://" in log, "the daemon logged nothing: the check below would mean little"
    assert SECRET_KEY not in log, [line for line in log.splitlines() if SECRET_KEY in line][:5]
