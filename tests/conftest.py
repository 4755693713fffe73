"""Fixtures that mount nvfs for real: a store (a backing directory or an S3 bucket on a
SeaweedFS server started for the session), a mountpoint and the daemon; and the check that
every test carries a tier marker (docs/DEVELOPMENT.md, "Tests")."""

from __future__ import annotations

import itertools
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from nvfs.testing.procfs import children_of
from nvfs.testing.seaweed import SeaweedServer

NVFS = [sys.executable, "-m", "nvfs"]
MIB = 1 << 20
_buckets = itertools.count()


def nvfs(*args: str, check: bool = False, timeout: float = 120,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the ``nvfs`` command line; returns the finished process (text output)."""
    return subprocess.run([*NVFS, *args], capture_output=True, text=True, timeout=timeout, check=check,
                          env={**os.environ, **(env or {})})


def wait_until(predicate, what: str, timeout: float = 60.0) -> None:
    """Poll for a condition the daemon brings about in the background (GC has no completion API)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def wait_until_dead(pid: int, timeout: float, after: str) -> None:
    """Wait for a process that is not our child to terminate (a pidfd turns readable).

    Polling ``kill(pid, 0)`` would also wait for init to reap the zombie, which can be slow.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        readable, _, _ = select.select([pidfd], [], [], timeout)
        assert readable, f"process {pid} is still alive {timeout:.0f}s after {after}"
    finally:
        os.close(pidfd)


def drop_cache(path) -> None:
    """Evict the file's pages from the kernel page cache so reads reach the daemon."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def checkpoint_like(size: int, seed: int) -> bytes:
    """bf16-like values (a compressible exponent byte) with runs of zeros, as optimizer rows have."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(size // 4) * 0.02).astype(np.float32)
    data = bytearray((values.view(np.uint32) >> 16).astype(np.uint16).tobytes() * 2)
    data[size // 3 : size // 3 + MIB] = bytes(MIB)
    return bytes(data)


def fetch_children(daemon_pid: int) -> list[int]:
    """PIDs of the daemon's fetch processes (a killed, unreaped one has no command line)."""
    found = []
    for pid in children_of(daemon_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if b"nvfs.store.chunk_processes.child" in cmdline.read():
                    found.append(pid)
        except OSError:
            continue
    return sorted(found)


def _fuse_available() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (apt-get install fuse3)"
    return None


class Mount:
    """One nvfs mount of a store on ``mountpoint``, logging to ``log_file``.

    The store is the directory ``source``, or with ``s3`` a fresh bucket on that server
    (``source`` is then unused). ``keys``, ``read_object``, ``write_object`` and
    ``delete_object`` reach behind nvfs's back into either kind of store.
    """

    def __init__(self, root: Path, options: tuple[str, ...] = (), s3: SeaweedServer | None = None) -> None:
        self.source = root / "store"
        self.mountpoint = root / "mnt"
        self.log_file = root / "nvfs.log"
        self.options = options
        self.s3 = s3
        self.env: dict[str, str] = {}
        self.source.mkdir(exist_ok=True)
        self.mountpoint.mkdir(exist_ok=True)
        if s3 is not None:
            self.bucket = s3.create_bucket(f"nvfs-{os.getpid()}-{next(_buckets)}")
            self.url = f"s3://{self.bucket}/store"
            self.options = (*options, f"endpoint_url={s3.endpoint_url}")
            self.env = s3.environ()
        else:
            self.url = str(self.source)

    @property
    def path(self) -> Path:
        return self.mountpoint

    def mount(self, *extra: str) -> None:
        options = ",".join((f"log_file={self.log_file}", "log_level=debug", *self.options, *extra))
        result = nvfs("mount", self.url, str(self.mountpoint), "-o", options, env=self.env)
        assert result.returncode == 0, f"mount failed: {result.stderr}\n{self.log()}"
        assert os.path.ismount(self.mountpoint)

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key of the store under ``prefix``, sorted."""
        if self.s3 is None:
            base = self.source / prefix if prefix else self.source
            found = [path.relative_to(self.source).as_posix() for path in base.rglob("*") if path.is_file()]
            return sorted(key for key in found if not key.startswith(".tmp/"))
        pages = self.s3.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                           Prefix=f"store/{prefix}")
        return sorted(item["Key"][len("store/"):] for page in pages for item in page.get("Contents", []))

    def read_object(self, key: str) -> bytes:
        if self.s3 is None:
            return (self.source / key).read_bytes()
        return self.s3.client().get_object(Bucket=self.bucket, Key=f"store/{key}")["Body"].read()

    def write_object(self, key: str, data: bytes) -> None:
        if self.s3 is None:
            (self.source / key).write_bytes(data)
        else:
            self.s3.client().put_object(Bucket=self.bucket, Key=f"store/{key}", Body=data)

    def delete_object(self, key: str) -> None:
        if self.s3 is None:
            (self.source / key).unlink()
        else:
            self.s3.client().delete_object(Bucket=self.bucket, Key=f"store/{key}")

    def umount(self) -> None:
        result = nvfs("umount", str(self.mountpoint))
        assert result.returncode == 0, f"umount failed: {result.stderr}\n{self.log()}"
        assert not os.path.ismount(self.mountpoint)

    def remount(self) -> None:
        self.umount()
        self.mount()

    def daemon_pid(self) -> int:
        return int(os.getxattr(self.mountpoint, "user.nvfs.pid"))

    def kill(self) -> None:
        """SIGKILL the daemon (a crash) and take the dead mount away; writers see ENOTCONN from here on."""
        pid = self.daemon_pid()
        os.kill(pid, signal.SIGKILL)
        wait_until_dead(pid, 30, "SIGKILL")
        self.lazy_unmount()

    def lazy_unmount(self) -> None:
        """Detach a mount whose daemon is dead (``fusermount3 -u -z``)."""
        result = subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0, f"fusermount3 -u -z failed: {result.stderr}"

    def log(self) -> str:
        return self.log_file.read_text() if self.log_file.exists() else ""

    def is_in_mount_table(self) -> bool:
        """Mounted, even if dead: ``os.path.ismount`` says no once the daemon is gone (ENOTCONN)."""
        with open("/proc/self/mountinfo") as table:
            return any(line.split()[4] == str(self.mountpoint) for line in table)

    def force_cleanup(self) -> None:
        """Tear down whatever a failed test left behind, so later tests get a clean slate."""
        if not self.is_in_mount_table():
            return
        if not os.path.ismount(self.mountpoint) or nvfs("umount", str(self.mountpoint)).returncode != 0:
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], check=False)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    """A SeaweedFS S3 server on 127.0.0.1 for the whole session."""
    server = SeaweedServer(tmp_path_factory.mktemp("seaweed"))
    server.start()
    yield server
    server.close()


@pytest.fixture
def own_server(tmp_path):
    """An S3 server of this test's own, so that it can be stopped or paused without disturbing others."""
    server = SeaweedServer(tmp_path / "seaweed")
    server.start()
    yield server
    server.close()


@pytest.fixture(params=["dir", pytest.param("s3", marks=pytest.mark.s3)])
def backend(request) -> str:
    """Run a test against both kinds of store: a local directory and S3 (that run is marked ``s3``)."""
    return request.param


@pytest.fixture
def mount_factory(tmp_path, request):
    """Make (unmounted) :class:`Mount` objects under ``tmp_path``; all are torn down at the end.

    ``make(backend="s3")`` puts the store in a fresh bucket of the session's S3 server.
    """
    made: list[Mount] = []
    reason = _fuse_available()
    if reason:
        pytest.skip(reason)

    def make(name: str = "m", options: tuple[str, ...] = (), backend: str = "dir") -> Mount:
        if backend == "s3" and request.node.get_closest_marker("s3") is None:
            pytest.fail(f"{request.node.nodeid} mounts an S3 store but is not marked s3", pytrace=False)
        root = tmp_path / name
        root.mkdir(exist_ok=True)
        s3 = request.getfixturevalue("seaweed") if backend == "s3" else None
        mount = Mount(root, options, s3)
        made.append(mount)
        return mount

    yield make
    for mount in made:
        mount.force_cleanup()


@pytest.fixture
def mounted(mount_factory, backend) -> Mount:
    """A fresh store, mounted: once on a backing directory, once on S3."""
    mount = mount_factory(backend=backend)
    mount.mount()
    return mount


# Tier markers say what a test needs (registered in pyproject.toml, explained in
# docs/DEVELOPMENT.md): the fast tiers are only trustworthy if no test can be left out of
# them by forgetting its marker, or run in them while it mounts or starts a server.
TIERS = ("unit", "fuse", "s3", "gpu")
S3_FIXTURES = frozenset({"seaweed", "own_server"})
MOUNT_FIXTURES = frozenset({"mount_factory"})


def tier_problems(item: pytest.Item) -> list[str]:
    """What is wrong with ``item``'s tier markers, judged by the fixtures and parameters it uses."""
    marked = {tier for tier in TIERS if item.get_closest_marker(tier) is not None}
    uses = set(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    on_s3 = callspec is not None and callspec.params.get("backend") == "s3"
    problems = []
    if not marked:
        problems.append("has no tier marker: mark it unit, fuse, s3 or gpu")
    if "unit" in marked and len(marked) > 1:
        problems.append(f"is marked unit, which needs nothing, and also {sorted(marked - {'unit'})}")
    if (uses & S3_FIXTURES or on_s3) and "s3" not in marked:
        problems.append("uses a SeaweedFS server but is not marked s3")
    if uses & MOUNT_FIXTURES and "fuse" not in marked:
        problems.append("mounts nvfs (mount_factory) but is not marked fuse")
    return problems


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Fail the collection, before ``-m`` deselects anything, if any test's tier is missing or wrong."""
    problems = [f"  {item.nodeid} {problem}" for item in items for problem in tier_problems(item)]
    if problems:
        raise pytest.UsageError("tier markers (see docs/DEVELOPMENT.md, Tests):\n" + "\n".join(problems))
