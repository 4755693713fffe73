"""Special files, setgid directories and the times a rename gives directories, on a real mount."""

from __future__ import annotations

import errno
import os
import socket
import stat
import threading

import pytest

pytestmark = pytest.mark.fuse

OTHER_GROUP = 4321  # a group nobody here belongs to: inheritance, not the creator, must set it


def _kind_and_device(path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_rdev


def _make_special_files(root) -> dict[str, tuple[int, int, int]]:
    """A fifo, a character and a block device and a bound unix socket; what stat says of each.

    The modes have no write bits for group and others, which the usual umask (022) leaves as they are.
    """
    os.mkfifo(root / "fifo", 0o640)
    os.mknod(root / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    os.mknod(root / "disk", stat.S_IFBLK | 0o644, os.makedev(8, 17))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(root / "socket"))
    return {name: _kind_and_device(root / name) for name in ("fifo", "null", "disk", "socket")}


def test_special_files_survive_a_remount(mounted):
    seen = _make_special_files(mounted.path)
    assert seen["fifo"] == (stat.S_IFIFO, 0o640, 0)
    assert seen["null"] == (stat.S_IFCHR, 0o600, os.makedev(1, 3))
    assert seen["disk"] == (stat.S_IFBLK, 0o644, os.makedev(8, 17))
    assert seen["socket"][0] == stat.S_IFSOCK
    os.chmod(mounted.path / "fifo", 0o604)
    os.rename(mounted.path / "disk", mounted.path / "disk2")
    os.unlink(mounted.path / "null")
    mounted.remount()
    assert sorted(os.listdir(mounted.path)) == ["disk2", "fifo", "socket"]
    assert _kind_and_device(mounted.path / "fifo") == (stat.S_IFIFO, 0o604, 0)
    assert _kind_and_device(mounted.path / "disk2") == seen["disk"]
    assert _kind_and_device(mounted.path / "socket") == seen["socket"]


def test_fifo_on_the_mount_carries_data(mounted):
    fifo = mounted.path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    with open(fifo, "wb") as writer:  # blocks until the reader has opened its end
        writer.write(b"through the kernel's pipe")
    reader.join(timeout=30)
    assert received == [b"through the kernel's pipe"]
    assert os.path.getsize(fifo) == 0  # nothing of it went to the store


def test_unix_socket_bound_on_the_mount_accepts_connections(mounted):
    path = str(mounted.path / "server.sock")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen()
        server.settimeout(30)
        with socket.socket(socket.AF_UNIX) as client:
            client.settimeout(30)
            client.connect(path)
            accepted, _ = server.accept()
            with accepted:
                client.sendall(b"ping")
                assert accepted.recv(4) == b"ping"


def test_devices_on_the_mount_do_not_open(mounted):
    """A FUSE mount is nodev: a device node is stored, but nothing reaches the device through it."""
    os.mknod(mounted.path / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    with pytest.raises(PermissionError) as info:
        os.open(mounted.path / "null", os.O_RDONLY)
    assert info.value.errno == errno.EACCES


def test_setgid_directory_passes_on_its_group(mounted):
    shared = mounted.path / "shared"
    shared.mkdir()
    os.chown(shared, -1, OTHER_GROUP)
    os.chmod(shared, 0o2775)
    (shared / "file").write_bytes(b"x")
    assert os.stat(shared / "file").st_gid == OTHER_GROUP
    (shared / "sub").mkdir(mode=0o755)
    os.symlink("file", shared / "link")
    os.mkfifo(shared / "fifo")
    (shared / "sub" / "deeper").mkdir()
    plain = mounted.path / "plain"
    plain.mkdir()
    (plain / "file").write_bytes(b"y")

    def check() -> None:
        for name in ("file", "sub", "link", "fifo", "sub/deeper"):
            assert os.lstat(shared / name).st_gid == OTHER_GROUP, name
        for name in ("sub", "sub/deeper"):
            assert os.stat(shared / name).st_mode & stat.S_ISGID, f"{name} lost S_ISGID"
        assert not os.stat(shared / "file").st_mode & stat.S_ISGID
        assert os.stat(plain / "file").st_gid == os.getgid()

    check()
    mounted.remount()
    check()


def _times(path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_mtime_ns, st.st_ctime_ns


def test_rename_moves_both_directories_times_and_they_persist(mounted):
    source, target = mounted.path / "source", mounted.path / "target"
    source.mkdir()
    target.mkdir()
    (source / "moved").write_bytes(b"m")
    (source / "renamed").write_bytes(b"r")
    source_before, target_before = _times(source), _times(target)
    moved_ctime = os.stat(source / "moved").st_ctime_ns

    os.rename(source / "moved", target / "moved")
    source_after, target_after = _times(source), _times(target)
    assert source_after[0] > source_before[0] and source_after[1] > source_before[1]
    assert target_after[0] > target_before[0] and target_after[1] > target_before[1]
    assert os.stat(target / "moved").st_ctime_ns > moved_ctime

    os.rename(source / "renamed", source / "renamed-in-place")  # within one directory
    in_place = _times(source)
    assert in_place[0] > source_after[0] and in_place[1] > source_after[1]

    mounted.remount()  # directory markers keep a directory's times
    assert _times(source) == in_place
    assert _times(target) == target_after


def test_rename_and_unlink_right_after_close_hold_across_a_remount(mounted):
    """The commit of a closed file runs after close(2) returns; a rename or unlink just after must win."""
    for index in range(10):
        (mounted.path / f"written{index}").write_bytes(b"w%d" % index)
        os.rename(mounted.path / f"written{index}", mounted.path / f"renamed{index}")
        (mounted.path / f"doomed{index}").write_bytes(b"d")
        os.unlink(mounted.path / f"doomed{index}")
    (mounted.path / "staging").mkdir()
    for index in range(10):
        (mounted.path / "staging" / f"part{index}").write_bytes(b"p%d" % index)
    os.rename(mounted.path / "staging", mounted.path / "final")
    mounted.remount()
    assert sorted(os.listdir(mounted.path)) == sorted(["final", *(f"renamed{index}" for index in range(10))])
    for index in range(10):
        assert (mounted.path / f"renamed{index}").read_bytes() == b"w%d" % index
        assert (mounted.path / "final" / f"part{index}").read_bytes() == b"p%d" % index
