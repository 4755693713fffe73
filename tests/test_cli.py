"""The ``nvfs`` command line: bad input gets one line on stderr and a non-zero exit, no traceback."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import blake3
import pytest

from nvfs.daemon import KERNEL_READAHEAD, mount_device
from tests.conftest import nvfs

pytestmark = pytest.mark.fuse


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file (with contents) and directory (None) below ``root``, hidden ones included."""
    return {
        str(path.relative_to(root)): path.read_bytes() if path.is_file() else None
        for path in sorted(root.rglob("*"))
    }


def _assert_error(result: subprocess.CompletedProcess, *mentions: str) -> str:
    """A failure reported as exactly one line on stderr that names what is wrong."""
    assert result.returncode != 0, f"expected a failure, got exit 0: {result.stdout}{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    message = result.stderr.strip()
    assert message, "the failure printed nothing on stderr"
    assert "\n" not in message, f"expected one line on stderr, got:\n{result.stderr}"
    for mention in mentions:
        assert mention in message, f"{mention!r} is not named in: {message}"
    return message


def _mount_cli(mount, *args: str) -> subprocess.CompletedProcess:
    """``nvfs mount SOURCE MOUNTPOINT`` of ``mount`` with extra arguments (logging to its log file)."""
    return nvfs("mount", str(mount.source), str(mount.mountpoint), "-o", f"log_file={mount.log_file}",
                *args)


# ----- mount: bad input -----------------------------------------------------------------------

def test_missing_source(mount_factory, tmp_path):
    mount = mount_factory()
    missing = tmp_path / "no-such-store"
    result = nvfs("mount", str(missing), str(mount.mountpoint), "-o", f"log_file={mount.log_file}")
    _assert_error(result, str(missing))
    assert not os.path.ismount(mount.mountpoint)
    assert not missing.exists()


def test_source_is_a_regular_file(mount_factory, tmp_path):
    mount = mount_factory()
    source = tmp_path / "store-file"
    source.write_bytes(b"not a directory\n")
    result = nvfs("mount", str(source), str(mount.mountpoint), "-o", f"log_file={mount.log_file}")
    _assert_error(result, str(source))
    assert not os.path.ismount(mount.mountpoint)
    assert source.read_bytes() == b"not a directory\n"


def test_source_is_a_foreign_directory(mount_factory):
    mount = mount_factory()
    (mount.source / "photos").mkdir()
    (mount.source / "photos" / "cat.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    (mount.source / "notes.txt").write_text("someone else's files\n")
    result = _mount_cli(mount)
    _assert_error(result, str(mount.source))
    assert not os.path.ismount(mount.mountpoint)
    assert not (mount.source / "nvfs.json").exists()


def test_foreign_directory_is_left_untouched(mount_factory):
    """Refusing a directory that is not a store must not change anything in it, hidden files included."""
    mount = mount_factory()
    (mount.source / "notes.txt").write_text("someone else's files\n")
    (mount.source / ".tmp").mkdir()
    (mount.source / ".tmp" / "draft.txt").write_text("work in progress, keep me\n")
    before = _snapshot(mount.source)
    result = _mount_cli(mount)
    _assert_error(result, str(mount.source))
    assert not os.path.ismount(mount.mountpoint)
    assert _snapshot(mount.source) == before, "mounting a foreign directory changed or deleted its files"


def test_missing_mountpoint(mount_factory, tmp_path):
    mount = mount_factory()
    missing = tmp_path / "no-such-mountpoint"
    result = nvfs("mount", str(mount.source), str(missing), "-o", f"log_file={mount.log_file}")
    _assert_error(result, str(missing))
    assert not missing.exists()
    assert list(mount.source.iterdir()) == [], "a failed mount initialised the store anyway"


def test_mountpoint_is_busy(mount_factory):
    first = mount_factory("first")
    first.mount()
    (first.path / "kept.txt").write_text("first mount\n")
    second = mount_factory("second")
    result = nvfs("mount", str(second.source), str(first.mountpoint), "-o", f"log_file={second.log_file}")
    _assert_error(result, str(first.mountpoint))
    assert (first.path / "kept.txt").read_text() == "first mount\n"
    assert list(second.source.iterdir()) == []
    first.umount()
    assert not os.path.ismount(first.mountpoint), "the failed mount stacked a second mount on top"


@pytest.mark.parametrize(("option", "named"), [
    ("bogus=1", "bogus"), ("chunk_size=abc", "abc"), ("engine=fast", "engine"), ("gpu=-1", "gpu"),
    ("gpu=one", "gpu"), ("codec=lz4", "codec"), ("cached_writes=1", "cached_writes"),
    ("write_timeout=0.5", "write_timeout"), ("chunksize=1M", "did you mean chunk_size?"),
    ("endpoint_url=s3.example.com", "endpoint_url must be an http:// or https:// URL"),
    ("stage_dir=", "stage_dir needs a value"),
], ids=["unknown_option", "bad_option_value", "unknown_engine", "negative_gpu", "gpu_not_a_number",
        "unknown_codec", "flag_with_value", "write_timeout_too_short", "misspelt_option",
        "url_without_scheme", "empty_path"])
def test_bad_option_is_refused(mount_factory, option, named):
    mount = mount_factory()
    result = _mount_cli(mount, "-o", option)
    _assert_error(result, named)
    assert not os.path.ismount(mount.mountpoint)
    assert list(mount.source.iterdir()) == []


@pytest.mark.parametrize("options", ["engine=gpu", "engine=gpu,gpu=1", "engine=cpu,codec=ans"])
def test_unavailable_engine_fails_the_mount(mount_factory, options):
    """On a machine without a usable GPU engine, asking for one is a clear error, not a CPU fallback."""
    mount = mount_factory()
    result = _mount_cli(mount, "-o", options)
    _assert_error(result, "engine")
    assert not os.path.ismount(mount.mountpoint)
    assert list(mount.source.iterdir()) == [], "a refused mount initialised the store"


def test_engine_options_select_the_cpu_engine(mount_factory):
    mount = mount_factory()
    mount.mount("engine=cpu", "gpu=0", "codec=portable")
    (mount.path / "f.bin").write_bytes(bytes(range(256)) * 4096)
    mount.remount()
    assert (mount.path / "f.bin").read_bytes() == bytes(range(256)) * 4096
    assert os.getxattr(mount.path / "f.bin", "user.nvfs.engine") == b"cpu"
    assert "engine cpu" in mount.log()


@pytest.mark.parametrize("kind", ["missing", "foreign"])
def test_unusable_cache_dir_is_refused(mount_factory, tmp_path, kind):
    """A cache directory is only ever one nvfs made: eviction deletes files in it."""
    mount = mount_factory()
    cache = tmp_path / "cache"
    if kind == "foreign":
        cache.mkdir()
        (cache / "notes.txt").write_text("not a cache\n")
    result = _mount_cli(mount, "-o", f"cache_dir={cache}")
    _assert_error(result, str(cache))
    assert not os.path.ismount(mount.mountpoint)
    if kind == "foreign":
        assert [p.name for p in cache.iterdir()] == ["notes.txt"]


def test_second_mount_of_a_mounted_store_is_refused(mount_factory):
    first = mount_factory("first")
    first.mount()
    (first.path / "data.txt").write_text("only one daemon may own a store\n")
    other = mount_factory("other")
    result = nvfs("mount", str(first.source), str(other.mountpoint), "-o", f"log_file={other.log_file}")
    _assert_error(result, str(first.source))
    assert not os.path.ismount(other.mountpoint)
    assert (first.path / "data.txt").read_text() == "only one daemon may own a store\n"
    first.remount()
    assert (first.path / "data.txt").read_text() == "only one daemon may own a store\n"


# ----- umount and stat: bad input -----------------------------------------------------------------

def test_umount_of_a_path_that_is_not_mounted(tmp_path):
    result = nvfs("umount", str(tmp_path))
    _assert_error(result, str(tmp_path))


def test_stat_of_a_missing_path(tmp_path):
    result = nvfs("stat", str(tmp_path / "missing.bin"))
    _assert_error(result, "missing.bin")


def test_stat_of_a_file_not_on_nvfs(tmp_path):
    path = tmp_path / "plain.txt"
    path.write_text("on the host filesystem\n")
    result = nvfs("stat", str(path))
    _assert_error(result, str(path))


# ----- the good paths ------------------------------------------------------------------------------

def test_stat_reports_sizes_ratio_and_codec(mounted):
    packed = mounted.path / "packed.bin"
    packed.write_bytes(b"checkpoint " * 100_000)
    noise = mounted.path / "noise.bin"
    noise_data = os.urandom(300_000)
    noise.write_bytes(noise_data)

    result = nvfs("stat", "--json", str(packed), str(noise))
    assert result.returncode == 0, result.stderr
    rows = {Path(row["path"]).name: row for row in map(json.loads, result.stdout.splitlines())}
    assert set(rows) == {"packed.bin", "noise.bin"}
    row = rows["packed.bin"]
    assert row["logical_size"] == 1_100_000
    assert 0 < row["stored_size"] < row["logical_size"] // 10
    assert abs(row["ratio"] - row["logical_size"] / row["stored_size"]) < 0.01
    assert row["codec"] == "zstd"
    assert rows["noise.bin"]["logical_size"] == len(noise_data)
    assert rows["noise.bin"]["codec"] == "raw"
    assert rows["noise.bin"]["stored_size"] >= len(noise_data)

    result = nvfs("stat", str(mounted.path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(word in lines[0] for word in ("logical", "stored", "ratio", "codec")), lines[0]
    (packed_line,) = [line for line in lines if line.endswith("packed.bin")]
    assert "zstd" in packed_line and "MiB" in packed_line
    ratio = f"{row['ratio']:.2f}x"
    assert ratio in packed_line, f"{ratio} not in {packed_line!r}"
    assert any(line.endswith("noise.bin") and "raw" in line for line in lines)
    assert "total (2 files)" in lines[-1]


def test_generic_mount_options_are_accepted(mount_factory):
    mount = mount_factory()
    mount.mount("rw", "noatime", "_netdev", "nodev", "nosuid")
    (mount.path / "f.txt").write_text("generic options\n")
    mount.remount()
    assert (mount.path / "f.txt").read_text() == "generic options\n"


def test_the_kernel_reads_ahead_a_mebibyte_once_mount_returns(mount_factory):
    """The mount's read-ahead is widened after the kernel has taken the INIT reply, which
    would narrow it again to 128 KiB (it did while the daemon set it before serving)."""
    if os.geteuid() != 0:
        pytest.skip("only root may widen a mount's read-ahead")
    mount = mount_factory()
    mount.mount()
    device = mount_device(str(mount.mountpoint))
    assert int(Path(f"/sys/class/bdi/{device}/read_ahead_kb").read_text()) == KERNEL_READAHEAD >> 10


def test_mount_without_subcommand(mount_factory):
    """``nvfs SOURCE MOUNTPOINT -o ...`` is what mount.fuse3 runs."""
    mount = mount_factory()
    result = nvfs(str(mount.source), str(mount.mountpoint), "-o", f"log_file={mount.log_file}")
    assert result.returncode == 0, f"{result.stderr}\n{mount.log()}"
    assert os.path.ismount(mount.mountpoint)
    (mount.path / "f.txt").write_text("mount.fuse3 form\n")
    mount.remount()
    assert (mount.path / "f.txt").read_text() == "mount.fuse3 form\n"


def test_empty_source_is_initialised(mount_factory):
    mount = mount_factory()
    assert list(mount.source.iterdir()) == []
    mount.mount()
    superblock = json.loads((mount.source / "nvfs.json").read_bytes())
    version = superblock.get("nvfs_store")
    assert isinstance(version, int) and version >= 1, superblock
    assert os.listdir(mount.path) == []
    mount.umount()
    assert json.loads((mount.source / "nvfs.json").read_bytes()) == superblock
    mount.mount()  # an initialised store is a store, not a foreign directory
    assert os.listdir(mount.path) == []


def _chunk_paths(mount) -> set[str]:
    """Where the store keeps chunk objects, relative to the source directory."""
    chunks = (mount.source / "chunks").rglob("*")
    return {str(path.relative_to(mount.source)) for path in chunks if path.is_file()}


def test_new_store_names_chunks_by_blake3_one_directory_deep(mount_factory):
    mount = mount_factory()
    mount.mount()
    superblock = json.loads((mount.source / "nvfs.json").read_bytes())
    assert (superblock["nvfs_store"], superblock["hash"]) == (3, "blake3"), superblock
    data = os.urandom(100_000)
    (mount.path / "f.bin").write_bytes(data)
    mount.remount()
    assert (mount.path / "f.bin").read_bytes() == data
    name = blake3.blake3(data).hexdigest()
    assert _chunk_paths(mount) == {f"chunks/{name[:2]}/{name}"}


@pytest.mark.parametrize("version, hash_name", [(1, "sha256"), (2, "blake3")])
def test_older_store_keeps_its_hash_and_chunk_layout(mount_factory, version, hash_name):
    """Stores made before BLAKE3 (format 1) or before the one-level chunk layout (format 2) go
    on naming and placing their chunks as they did; their superblock is left as it is."""
    mount = mount_factory()
    mount.mount()
    mount.umount()
    superblock = {"nvfs_store": version, "created": "2026-11-29T10:00:00Z", "hash": hash_name,
                  "chunk_size": 4 << 20}
    (mount.source / "nvfs.json").write_text(json.dumps(superblock))
    mount.mount()
    data = os.urandom(100_000)
    (mount.path / "old.bin").write_bytes(data)
    mount.remount()
    assert (mount.path / "old.bin").read_bytes() == data
    name = {"sha256": hashlib.sha256, "blake3": blake3.blake3}[hash_name](data).hexdigest()
    assert _chunk_paths(mount) == {f"chunks/{name[:2]}/{name[2:4]}/{name}"}
    assert json.loads((mount.source / "nvfs.json").read_bytes()) == superblock


def test_newer_store_format_is_refused(mount_factory):
    mount = mount_factory()
    mount.mount()
    mount.umount()
    (mount.source / "nvfs.json").write_text(json.dumps({"nvfs_store": 4, "hash": "blake3"}))
    result = _mount_cli(mount)
    _assert_error(result, "store format 4 is newer")
    assert not os.path.ismount(mount.mountpoint)


def test_unknown_chunk_hash_is_refused(mount_factory):
    mount = mount_factory()
    mount.mount()
    mount.umount()
    superblock = {"nvfs_store": 2, "hash": "md5", "chunk_size": 4 << 20}
    (mount.source / "nvfs.json").write_text(json.dumps(superblock))
    result = _mount_cli(mount)
    _assert_error(result, "md5", "nvfs.json")
    assert not os.path.ismount(mount.mountpoint)
