"""A file's new version is committed by the last close, fsync or unmount, not by any close(2).

The kernel sends FUSE ``flush`` on every close(2): of a dup'ed descriptor, of the copy a
child process closes before it runs another program, of the descriptor a shell or ``dd``
closes after moving it to stdout. Each case below overwrites a committed file part way,
has such a close happen, kills the daemon with SIGKILL, and checks that the store still
holds the old version byte for byte; then the positive side: after the last close the new
version is committed and survives SIGKILL.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import wait_until

pytestmark = pytest.mark.fuse

MIB = 1 << 20
OLD_SIZE = 9 * MIB + 4321  # several chunks and a partial last one
PART = 5 * MIB + 77  # what each writer has written of the new version when the daemon dies


def _committed(path: Path) -> bool:
    try:
        return os.getxattr(path, "user.nvfs.committed") == b"yes"
    except FileNotFoundError:
        return False


def _manifest_size(mount, name: str) -> int | None:
    try:
        return json.loads(mount.read_object(f"tree/{name}"))["size"]
    except Exception:  # not there (yet): a missing file or object
        return None


def _write_old_version(mount, name: str = "ckpt") -> tuple[Path, bytes]:
    path = mount.path / name
    old = os.urandom(OLD_SIZE)
    path.write_bytes(old)
    wait_until(lambda: _committed(path) and _manifest_size(mount, name) == len(old),
               "the old version is committed", timeout=30)
    return path, old


def _assert_old_version_survived(mount, path: Path, old: bytes) -> None:
    assert _manifest_size(mount, path.name) == len(old), "a partial new version was committed"
    mount.mount()
    data = path.read_bytes()
    assert len(data) == len(old), f"{len(data)} bytes after the crash, {len(old)} before the overwrite"
    assert data == old, "after the crash the file is not its old version"


def _assert_new_version_survives(mount, path: Path, new: bytes) -> None:
    """The last close committed ``new``: it is in the store and survives a crash of the daemon."""
    wait_until(lambda: _committed(path) and _manifest_size(mount, path.name) == len(new),
               "the last close committed the new version", timeout=30)
    mount.kill()
    mount.mount()
    assert path.read_bytes() == new


def _crash_while_writing(mount, path: Path, fd: int) -> None:
    """Kill the daemon while ``fd`` still writes an unfinished version, then close ``fd``."""
    try:
        assert not _committed(path)
        mount.kill()
    finally:
        try:
            os.close(fd)
        except OSError as exc:  # the dead mount may report the lost data at close
            assert exc.errno in (errno.ENOTCONN, errno.EIO, errno.ECONNABORTED), exc


def _wait_for_size(path: Path, size: int) -> None:
    wait_until(lambda: os.stat(path).st_size >= size, f"{size} bytes reached {path.name}", timeout=30)


def test_dd_from_a_pipe_commits_nothing_before_it_closes(mount_factory, backend, tmp_path):
    mount = mount_factory(backend=backend)
    mount.mount()
    path, old = _write_old_version(mount)
    fifo = tmp_path / "feed"
    os.mkfifo(fifo)
    dd = subprocess.Popen(["dd", f"if={fifo}", f"of={path}", "bs=64K"], stderr=subprocess.DEVNULL)
    try:
        with open(fifo, "wb") as feed:  # opened after dd opened the output: dd opens if= first
            feed.write(os.urandom(PART))
            feed.flush()
            _wait_for_size(path, PART)
            mount.kill()
    finally:
        dd.kill()
        dd.wait(timeout=30)
    _assert_old_version_survived(mount, path, old)


def test_shell_redirection_commits_nothing_before_the_writer_exits(mount_factory, backend):
    mount = mount_factory(backend=backend)
    mount.mount()
    path, old = _write_old_version(mount)
    # The shell opens the file, moves it to stdout (closing the descriptor it opened) and runs cat.
    shell = subprocess.Popen(["sh", "-c", f"exec cat > '{path}'"], stdin=subprocess.PIPE)
    try:
        assert shell.stdin is not None
        shell.stdin.write(os.urandom(PART))
        shell.stdin.flush()
        _wait_for_size(path, PART)
        mount.kill()
    finally:
        shell.kill()
        shell.wait(timeout=30)
    _assert_old_version_survived(mount, path, old)


@pytest.mark.parametrize("closer", ["dup", "child"])
def test_a_second_close_while_writing_commits_nothing(mount_factory, backend, closer):
    mount = mount_factory(backend=backend)
    mount.mount()
    path, old = _write_old_version(mount)
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, os.urandom(PART))
    if closer == "dup":
        os.close(os.dup(fd))
    else:  # the child closes its copy of the descriptor before it runs the program
        subprocess.run(["true"], check=True, close_fds=True)
    _crash_while_writing(mount, path, fd)
    _assert_old_version_survived(mount, path, old)


def test_truncate_while_open_for_writing_keeps_the_old_version(mount_factory, backend):
    mount = mount_factory(backend=backend)
    mount.mount()
    path, old = _write_old_version(mount)
    fd = os.open(path, os.O_RDWR)
    os.truncate(path, 0)  # by path, by someone else: no handle of theirs is open
    os.write(fd, os.urandom(PART))
    _crash_while_writing(mount, path, fd)
    _assert_old_version_survived(mount, path, old)


def test_the_last_close_commits_the_new_version(mount_factory, backend):
    mount = mount_factory(backend=backend)
    mount.mount()
    path, old = _write_old_version(mount)
    new = os.urandom(OLD_SIZE + 3 * MIB + 9)
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, new[:PART])
    os.close(os.dup(fd))
    subprocess.run(["true"], check=True)
    os.write(fd, new[PART:])
    os.close(fd)
    _assert_new_version_survives(mount, path, new)


def test_the_last_close_of_a_shell_redirection_commits(mount_factory, backend):
    mount = mount_factory(backend=backend)
    mount.mount()
    path, _ = _write_old_version(mount)
    new = os.urandom(2 * MIB + 5)
    subprocess.run(["sh", "-c", f"exec cat > '{path}'"], input=new, check=True, timeout=60)
    _assert_new_version_survives(mount, path, new)


def test_o_trunc_sets_mtime_and_ctime(mount_factory, backend):
    mount = mount_factory(backend=backend)
    mount.mount()
    path, _ = _write_old_version(mount)
    before = os.stat(path)
    os.close(os.open(path, os.O_WRONLY | os.O_TRUNC))
    after = os.stat(path)
    assert after.st_size == 0
    assert after.st_mtime_ns > before.st_mtime_ns and after.st_ctime_ns > before.st_ctime_ns
    wait_until(lambda: _manifest_size(mount, path.name) == 0, "the empty version is committed", timeout=30)
    mount.remount()
    assert os.stat(path).st_mtime_ns == after.st_mtime_ns


def test_fsync_commits_while_the_file_stays_open(mount_factory, backend):
    mount = mount_factory(backend=backend)
    mount.mount()
    path, _ = _write_old_version(mount)
    new = os.urandom(PART)
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(new)
        f.flush()
        os.fsync(f.fileno())
        assert _manifest_size(mount, path.name) == len(new)
        mount.kill()
        try:
            f.close()
        except OSError as exc:  # the dead mount may report that at close
            assert exc.errno in (errno.ENOTCONN, errno.EIO, errno.ECONNABORTED), exc
    mount.mount()
    assert path.read_bytes() == new


def test_chmod_while_writing_is_durable_without_committing_the_data(mount_factory, backend):
    mount = mount_factory(backend=backend)
    mount.mount()
    path, old = _write_old_version(mount)
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, os.urandom(PART))
        os.chmod(path, 0o600)
        wait_until(lambda: json.loads(mount.read_object("tree/ckpt"))["mode"] & 0o777 == 0o600,
                   "the mode is stored", timeout=30)
        mount.kill()
    finally:
        try:
            os.close(fd)
        except OSError as exc:
            assert exc.errno in (errno.ENOTCONN, errno.EIO, errno.ECONNABORTED), exc
    _assert_old_version_survived(mount, path, old)
    assert os.stat(path).st_mode & 0o777 == 0o600



@pytest.fixture
def small_store(mount_factory):
    """A directory store on a 12 MiB tmpfs: a large write fills it."""
    mount = mount_factory()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mount.source)], check=True)
    yield mount
    mount.force_cleanup()
    subprocess.run(["umount", str(mount.source)], check=True)


def test_a_full_store_fails_the_overwrite_with_enospc_and_readers_see_the_old_version(small_store):
    mount = small_store
    mount.mount()
    path = mount.path / "ckpt"
    old = os.urandom(2 * MIB + 11)
    path.write_bytes(old)
    wait_until(lambda: _committed(path), "the old version is committed", timeout=30)
    failures = set()
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        for _ in range(32):  # random bytes do not compress: 32 MiB cannot fit
            try:
                os.write(fd, os.urandom(MIB))
            except OSError as exc:
                failures.add(exc.errno)
                break
    finally:
        try:
            os.close(fd)
        except OSError as exc:
            failures.add(exc.errno)
    assert failures == {errno.ENOSPC}, [os.strerror(err) for err in failures]
    # Discarding the failed version and telling the kernel to forget it follow the last close.
    wait_until(lambda: _committed(path) and os.stat(path).st_size == len(old),
               "the failed version is discarded, here and in the kernel's cache", timeout=30)
    assert path.read_bytes() == old
    mount.remount()
    assert path.read_bytes() == old
