"""Directory renames on S3: whole after a crash (the intent is finished at the next mount).

S3 has no rename; a directory's objects are copied, then deleted. These kill the daemon in
the middle of one, or plant intents in the bucket, and check what the next mount makes of it;
and rename through a local stage (``-o stage_dir``), which must be private whatever the umask.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest

from tests.conftest import wait_until

pytestmark = [pytest.mark.fuse, pytest.mark.s3]

FILES = 300


def _contents(index: int) -> bytes:
    return f"file {index}\n".encode() * (index % 7 + 1)


def _intent(src: str, dst: str) -> bytes:
    return json.dumps({"op": "rename_prefix", "src": src, "dst": dst}).encode()


def test_kill_during_directory_rename_finishes_it_at_the_next_mount(mount_factory):
    mount = mount_factory(backend="s3")
    mount.mount()
    source = mount.path / "dirA"
    source.mkdir()
    for index in range(FILES):
        (source / f"f{index:03d}").write_bytes(_contents(index))
    assert len(mount.keys("tree/dirA/")) == FILES + 1  # the files and the directory's own object

    mover = subprocess.Popen(["mv", str(source), str(mount.path / "dirB")], stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: mount.keys("tree/dirB/"), "some objects are copied to dirB", timeout=60)
        mount.kill()
    finally:
        mover.wait(timeout=60)
    assert mount.keys("tree/dirA/"), "the daemon was killed only after the rename was over"

    mount.mount()
    assert sorted(os.listdir(mount.path)) == ["dirB"]
    assert sorted(os.listdir(mount.path / "dirB")) == [f"f{index:03d}" for index in range(FILES)]
    for index in range(FILES):
        assert (mount.path / "dirB" / f"f{index:03d}").read_bytes() == _contents(index)
    assert mount.keys("tree/dirA/") == []
    assert mount.keys("journal/") == []
    assert "finishing an interrupted rename of tree/dirA/ to tree/dirB/" in mount.log()


def test_bad_intents_are_left_alone(mount_factory):
    mount = mount_factory(backend="s3")
    mount.mount()
    (mount.path / "keep").mkdir()
    (mount.path / "keep" / "data").write_bytes(b"precious")
    mount.umount()
    bad = {
        "journal/rename-" + "1" * 32: b"{not json",
        "journal/rename-" + "2" * 32: _intent("tree/keep/", "chunks/"),
        "journal/rename-" + "3" * 32: _intent("tree/keep/", "tree/keep/inner/"),
        "journal/rename-" + "4" * 32: _intent("tree/../x/", "tree/y/"),
        "journal/rename-" + "5" * 32: b"[]",
        "journal/other": _intent("tree/keep/", "tree/gone/"),
    }
    for key, data in bad.items():
        mount.write_object(key, data)
    mount.mount()
    assert sorted(os.listdir(mount.path)) == ["keep"]
    assert (mount.path / "keep" / "data").read_bytes() == b"precious"
    assert mount.keys("journal/") == sorted(bad)
    log = mount.log()
    for key in bad:
        assert f"{key} is not a rename intent nvfs can follow" in log


def test_a_planted_intent_is_finished(mount_factory):
    """An intent whose move had not begun (a crash right after writing it) is carried out."""
    mount = mount_factory(backend="s3")
    mount.mount()
    (mount.path / "old").mkdir()
    (mount.path / "old" / "a").write_bytes(b"alpha")
    (mount.path / "old" / "sub").mkdir()
    (mount.path / "old" / "sub" / "b").write_bytes(b"beta")
    mount.umount()
    mount.write_object("journal/rename-" + "a" * 32, _intent("tree/old/", "tree/new/"))
    mount.mount()
    assert sorted(os.listdir(mount.path)) == ["new"]
    assert (mount.path / "new" / "a").read_bytes() == b"alpha"
    assert (mount.path / "new" / "sub" / "b").read_bytes() == b"beta"
    assert mount.keys("journal/") == []


def _modes(root) -> dict[str, int]:
    """``st_mode`` of everything under ``root`` (and of itself) that is still there."""
    found = {}
    for path in [root, *root.rglob("*")]:
        try:
            found[str(path.relative_to(root))] = os.lstat(path).st_mode
        except FileNotFoundError:
            continue  # uploaded and removed meanwhile
    return found


def test_stage_is_private_and_a_staged_directory_rename_lands_whole(mount_factory, tmp_path):
    stage = tmp_path / "stage"
    stage.mkdir(mode=0o755)
    umask = os.umask(0)  # the daemon inherits it: nothing it makes may be open to others anyway
    try:
        mount = mount_factory(backend="s3", options=(f"stage_dir={stage}",))
        mount.mount()
        (mount.path / "d").mkdir()
        for index in range(20):
            (mount.path / "d" / f"f{index}").write_bytes(_contents(index) * 1000)
        modes = _modes(stage)
        os.rename(mount.path / "d", mount.path / "e")
        mount.umount()  # uploads everything staged
    finally:
        os.umask(umask)
    assert len(modes) > 3, "nothing was staged"
    assert modes.keys() >= {".", "objects", "nvfs-stage.json"}
    for name, mode in modes.items():
        assert stat.S_IMODE(mode) == (0o700 if stat.S_ISDIR(mode) else 0o600), f"{name} is {mode:o}"
    assert stat.S_IMODE(os.stat(mount.log_file).st_mode) == 0o600

    assert mount.keys("tree/d/") == []
    assert len(mount.keys("tree/e/")) == 21
    mount.mount()
    assert sorted(os.listdir(mount.path / "e")) == sorted(f"f{index}" for index in range(20))
    for index in range(20):
        assert (mount.path / "e" / f"f{index}").read_bytes() == _contents(index) * 1000
