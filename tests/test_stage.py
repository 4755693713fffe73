"""stage_dir: closes return once data is staged locally; the stage drains to S3 behind them."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.conftest import Mount

pytestmark = [pytest.mark.fuse, pytest.mark.s3]


def _staged_keys(stage) -> list[str]:
    objects = stage / "objects"
    return sorted(p.relative_to(objects).as_posix() for p in objects.rglob("*")
                  if p.is_file() and ".tmp" not in p.parts)


def test_stage_drains_at_umount_and_data_reaches_s3(mount_factory, tmp_path):
    stage = tmp_path / "stage"
    stage.mkdir()
    mount = mount_factory(backend="s3", options=(f"stage_dir={stage}",))
    mount.mount()
    data = os.urandom(9 << 20)
    (mount.path / "ckpt.bin").write_bytes(data)
    assert (mount.path / "ckpt.bin").read_bytes() == data
    mount.umount()
    assert _staged_keys(stage) == []  # everything uploaded before the daemon exited
    assert mount.keys("tree/")
    (tmp_path / "plain").mkdir()
    plain = Mount(tmp_path / "plain", s3=mount.s3)  # the same bucket, without a stage
    plain.url, plain.bucket, plain.env = mount.url, mount.bucket, mount.env
    plain.options = mount.options[:-1]
    plain.mount()
    try:
        assert (plain.path / "ckpt.bin").read_bytes() == data
    finally:
        plain.force_cleanup()


def test_kill_during_drain_loses_nothing(tmp_path, own_server, request):
    """S3 down: closes still succeed (staged); kill -9; S3 back; the next mount drains it all."""
    stage = tmp_path / "stage"
    stage.mkdir()
    (tmp_path / "m").mkdir()
    mount = Mount(tmp_path / "m", (f"stage_dir={stage}", "metadata_ttl=0"), s3=own_server)
    request.addfinalizer(mount.force_cleanup)
    mount.mount()
    first = os.urandom(6 << 20)
    (mount.path / "first.bin").write_bytes(first)
    own_server.stop(timeout=0)
    second = os.urandom(5 << 20)
    (mount.path / "second.bin").write_bytes(second)  # staged locally while S3 is down
    assert (mount.path / "second.bin").read_bytes() == second
    assert any(key.startswith("tree/") for key in _staged_keys(stage))
    mount.kill()
    own_server.start()
    mount.mount()  # the same stage: resumes uploading what the killed daemon left
    assert (mount.path / "first.bin").read_bytes() == first
    assert (mount.path / "second.bin").read_bytes() == second
    mount.umount()
    assert _staged_keys(stage) == []
    assert {"tree/first.bin", "tree/second.bin"} <= set(mount.keys("tree/"))


def test_unmount_waits_for_uploads_still_pending(tmp_path, own_server, request):
    """Objects staged while S3 was paused are all uploaded before the daemon exits."""
    stage = tmp_path / "stage"
    stage.mkdir()
    (tmp_path / "m").mkdir()
    mount = Mount(tmp_path / "m", (f"stage_dir={stage}", "metadata_ttl=3600"), s3=own_server)
    request.addfinalizer(mount.force_cleanup)
    mount.mount()
    assert os.listdir(mount.path) == []  # listed now: creating a file then needs no S3 request
    group = os.getpgid(own_server.pid)
    os.killpg(group, signal.SIGSTOP)
    request.addfinalizer(lambda: os.killpg(group, signal.SIGCONT))
    try:
        data = os.urandom(24 << 20)
        (mount.path / "ckpt.bin").write_bytes(data)  # staged: close does not wait for S3
        assert len(_staged_keys(stage)) > 1
    finally:
        os.killpg(group, signal.SIGCONT)
    mount.umount()
    assert _staged_keys(stage) == []
    assert "tree/ckpt.bin" in mount.keys("tree/")
    assert json.loads(mount.read_object("tree/ckpt.bin"))["size"] == len(data)


def test_stage_of_another_store_is_refused(mount_factory, tmp_path):
    stage = tmp_path / "stage"
    stage.mkdir()
    first = mount_factory("a", backend="s3", options=(f"stage_dir={stage}",))
    first.mount()
    first.umount()
    second = mount_factory("b", backend="s3", options=(f"stage_dir={stage}",))
    from tests.conftest import nvfs

    result = nvfs("mount", second.url, str(second.mountpoint), "-o", ",".join(second.options), env=second.env)
    assert result.returncode != 0
    assert "belongs to another store" in result.stderr
    assert "Traceback" not in result.stderr
