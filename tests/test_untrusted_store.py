"""Whatever the store holds, nvfs touches nothing outside it and loses no more than the bad entry.

Anyone who can write to the bucket or the backing directory can write manifests and name
objects: these tests write crafted ones straight into the store (behind nvfs's back), then
mount it. A chunk id that walks out of the store or the disk cache must not read or delete
the file it points at; a bad manifest or name costs its own entry (skipped, logged), never
its directory; and an unparseable manifest neither stops garbage collection nor lets it
delete the chunks that manifest may name.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
import tempfile
from pathlib import Path

import pytest

from nvfs.store.manifest import Manifest, ManifestError
from tests.conftest import Mount, wait_until

pytestmark = pytest.mark.fuse

MIB = 1 << 20
CANARY = b"canary: nvfs must neither read nor delete this file\n"
GOOD = os.urandom(2 * MIB + 77)
GOOD_TOO = b"small and fine\n"


@pytest.fixture
def canary():
    """A file outside every store and cache, with a path short enough to fit in a 64-character id.

    It lives in a fresh directory under /tmp rather than in ``tmp_path``, whose path can be
    longer than a chunk id; the directory is removed at the end.
    """
    directory = Path(tempfile.mkdtemp(prefix="nvfs-canary-", dir="/tmp"))
    path = directory / "c"
    path.write_bytes(CANARY)
    yield path
    path.unlink(missing_ok=True)
    directory.rmdir()


def _traversal_id(target: Path) -> str:
    """``../../..//tmp/...``: 64 characters (the only check of the base code) that lead to ``target``."""
    relative = str(target).lstrip("/")
    pad = 64 - len(relative)
    assert pad >= 4, f"{target} is too long for a 64-character id"
    return "../" * (pad // 3) + "/" * (pad % 3) + relative


def _absolute_id(target: Path) -> str:
    """``//////tmp/...``: an absolute path of 64 characters to ``target``."""
    assert len(str(target)) < 64
    return "/" * (64 - len(str(target))) + str(target)


def _store_with_files(mount: Mount) -> dict:
    """``d/good.bin`` and ``d/good.txt`` written through nvfs; returns good.bin's manifest (unmounted)."""
    mount.mount()
    (mount.path / "d").mkdir()
    (mount.path / "d" / "good.bin").write_bytes(GOOD)
    (mount.path / "d" / "good.txt").write_bytes(GOOD_TOO)
    mount.umount()
    return json.loads(mount.read_object("tree/d/good.bin"))


def _put(mount: Mount, key: str, data: bytes) -> None:
    """Write object ``key`` behind nvfs's back (in a directory store, making its directories)."""
    if mount.s3 is None:
        (mount.source / key).parent.mkdir(parents=True, exist_ok=True)
    mount.write_object(key, data)


def _crafted(template: dict, **changes) -> bytes:
    return json.dumps({**template, **changes}).encode()


def _with_first_id(template: dict, cid: str) -> bytes:
    chunks = [list(ref) for ref in template["chunks"]]
    chunks[0][0] = cid
    return _crafted(template, chunks=chunks)


def _read_outcome(path: Path) -> str:
    """``"missing"`` (skipped), ``"EIO"``, or the data read (a failure of these tests)."""
    try:
        return repr(path.read_bytes()[:40])
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))


def _assert_good_files_intact(mount: Mount) -> None:
    assert (mount.path / "d" / "good.bin").read_bytes() == GOOD
    assert (mount.path / "d" / "good.txt").read_bytes() == GOOD_TOO


@pytest.mark.parametrize("cache", [False, True], ids=["no_cache", "cache_dir"])
def test_chunk_ids_leading_out_of_the_store_touch_nothing(mount_factory, backend, canary, tmp_path, cache):
    options: tuple[str, ...] = ()
    if cache:
        (tmp_path / "cache").mkdir()
        options = (f"cache_dir={tmp_path / 'cache'}",)
    mount = mount_factory(backend=backend, options=options)
    template = _store_with_files(mount)
    bad = {
        "traversal": _traversal_id(canary),
        "absolute": _absolute_id(canary),
        "nonhex": "g" * 64,
        "upper": secrets.token_hex(32).upper(),
    }
    for name, cid in bad.items():
        assert len(cid) == 64
        _put(mount, f"tree/d/{name}", _with_first_id(template, cid))

    mount.mount()
    listed = set(os.listdir(mount.path / "d"))
    outcomes = {name: _read_outcome(mount.path / "d" / name) for name in bad}
    _assert_good_files_intact(mount)
    mount.umount()

    assert canary.read_bytes() == CANARY
    assert listed == {"good.bin", "good.txt"}, "entries with bad chunk ids are skipped"
    assert set(outcomes.values()) == {"missing"}, outcomes
    log = mount.log()
    for name in bad:
        assert f"tree/d/{name}" in log, f"the log names the skipped key tree/d/{name}"


def test_cache_refuses_ids_that_leave_it_even_if_a_manifest_got_through(tmp_path, canary):
    """The disk cache checks ids itself: no path outside its root is read, written or deleted."""
    from nvfs.store.disk_cache import ChunkFileCache

    (tmp_path / "cache").mkdir()
    cache = ChunkFileCache(str(tmp_path / "cache"), 1 << 30)
    for cid in (_traversal_id(canary), _absolute_id(canary), "../" * 21 + "x"):
        assert cache.get(cid) is None
        cache.discard(cid)
        cache.put(cid, b"not a chunk")
    assert canary.read_bytes() == CANARY
    assert [path for path in (tmp_path / "cache").rglob("*") if path.is_file()] == [
        tmp_path / "cache" / "nvfs-cache.json"]


def test_cache_does_not_follow_a_symbolic_link_out_of_it(tmp_path, canary):
    from nvfs.store.disk_cache import ChunkFileCache

    (tmp_path / "cache").mkdir()
    cache = ChunkFileCache(str(tmp_path / "cache"), 1 << 30)
    chunks = tmp_path / "cache" / "chunks"
    cid = "aa" + secrets.token_hex(31)  # its directory chunks/aa/xx is a link out of the cache
    (chunks / cid[:2]).mkdir()
    (chunks / cid[:2] / cid[2:4]).symlink_to(canary.parent)
    (canary.parent / cid).write_bytes(b"outside")
    other = "bb" + secrets.token_hex(31)  # its file is a link to the canary
    (chunks / other[:2] / other[2:4]).mkdir(parents=True)
    (chunks / other[:2] / other[2:4] / other).symlink_to(canary)
    try:
        assert cache.get(cid) is None and cache.get(other) is None
        cache.discard(cid)
        cache.discard(other)
        assert (canary.parent / cid).read_bytes() == b"outside"
        assert canary.read_bytes() == CANARY
    finally:
        (canary.parent / cid).unlink(missing_ok=True)


NAMES = {"#x2f": "/", "#x2e2e": "..", "#x2e": ".", "#x": "(empty)", "#x610062": "a NUL b", "#xzz": "bad hex"}


def test_names_that_decode_to_no_single_component_are_skipped(mount_factory, backend):
    mount = mount_factory(backend=backend)
    template = _store_with_files(mount)
    for component in NAMES:
        _put(mount, f"tree/d/{component}", _crafted(template))
    _put(mount, "tree/d/#x2f2f/#dir", json.dumps(
        {"nvfs": 1, "type": "dir", "mode": stat.S_IFDIR | 0o755, "uid": 0, "gid": 0,
         "mtime_ns": 0, "ctime_ns": 0}).encode())

    mount.mount()
    listed = set(os.listdir(mount.path / "d"))
    _assert_good_files_intact(mount)
    mount.umount()
    assert listed == {"good.bin", "good.txt"}
    log = mount.log()
    for component in [*NAMES, "#x2f2f"]:
        assert f"tree/d/{component}" in log, f"one log line names {component} ({NAMES.get(component)})"


def test_bad_manifests_cost_only_their_own_entry(mount_factory, backend):
    """Sizes, slot sizes, chunk counts, lengths and modes that do not hold: skipped, logged."""
    mount = mount_factory(backend=backend)
    template = _store_with_files(mount)
    ref = template["chunks"][0]
    chunk_size = template["chunk_size"]
    bad = {
        "huge_size": _crafted(template, size=1 << 64),
        "negative_size": _crafted(template, size=-1),
        "zero_chunk_size": _crafted(template, chunk_size=0),
        "huge_chunk_size": _crafted(template, chunk_size=1 << 40, size=1 << 40),
        "too_many_chunks": _crafted(template, size=1, chunks=[ref, ref]),
        "long_chunk": _crafted(template, chunks=[[ref[0], chunk_size + 1, ref[2], ref[3]]]),
        "negative_length": _crafted(template, chunks=[[ref[0], -5, ref[2], ref[3]]]),
        "string_length": _crafted(template, chunks=[[ref[0], "5", ref[2], ref[3]]]),
        "dir_mode": _crafted(template, mode=stat.S_IFDIR | 0o755),
        "not_an_object": b"[1, 2, 3]",
        "newer_format": _crafted(template, nvfs=2),
    }
    for name, blob in bad.items():
        _put(mount, f"tree/d/{name}", blob)
    # A declared size far beyond the data is legal (a sparse file): it lists with that size.
    _put(mount, "tree/d/sparse", _crafted(template, size=10**15))
    _put(mount, "tree/d/holes", _crafted(template, chunks=[*template["chunks"], None, None]))  # legal too

    mount.mount()
    listed = set(os.listdir(mount.path / "d"))
    sparse_size = os.stat(mount.path / "d" / "sparse").st_size
    _assert_good_files_intact(mount)
    mount.umount()
    assert listed == {"good.bin", "good.txt", "sparse", "holes"}
    assert sparse_size == 10**15
    log = mount.log()
    for name in bad:
        assert f"tree/d/{name}" in log


def _fake_chunk_key(mount: Mount, real_key: str) -> tuple[str, str]:
    """A chunk object under a fresh id (a copy of a real one: GC goes by name only)."""
    cid = secrets.token_hex(32)
    key = f"chunks/{cid[:2]}/{cid}"
    _put(mount, key, mount.read_object(real_key))
    return cid, key


def test_gc_goes_on_past_unparseable_manifests_and_keeps_what_they_name(mount_factory, backend):
    mount = mount_factory(backend=backend, options=("gc_grace=0",))
    template = _store_with_files(mount)
    real_key = next(key for key in mount.keys("chunks/"))
    named_by_newer, newer_key = _fake_chunk_key(mount, real_key)
    named_by_garbage, garbage_key = _fake_chunk_key(mount, real_key)
    orphan, orphan_key = _fake_chunk_key(mount, real_key)
    _put(mount, "tree/d/newer", _crafted(template, nvfs=99, chunks=[[named_by_newer, 1, 1, "raw"]]))
    _put(mount, "tree/d/garbage", b"{\x00 not json " + named_by_garbage.encode() + b" ]")

    mount.mount()
    wait_until(lambda: orphan_key not in mount.keys("chunks/"), "GC deleted the orphan chunk", timeout=60)
    _assert_good_files_intact(mount)
    mount.umount()
    left = mount.keys("chunks/")
    assert newer_key in left and garbage_key in left, "chunks named in unparseable manifests are kept"
    assert orphan not in {key.rsplit("/", 1)[1] for key in left}
    assert all(f"chunks/{ref[0][:2]}/{ref[0]}" in left for ref in template["chunks"])
    assert "tree/d/newer" in mount.log() and "tree/d/garbage" in mount.log()


def test_special_kind_round_trips_and_checks_its_type_bits():
    fifo = Manifest("special", stat.S_IFIFO | 0o640, 1, 2, 3, 4)
    device = Manifest("special", stat.S_IFCHR | 0o600, 0, 0, 5, 6, rdev=os.makedev(1, 3))
    assert Manifest.from_bytes(fifo.to_bytes()) == fifo
    assert Manifest.from_bytes(device.to_bytes()) == device
    assert "rdev" in json.loads(device.to_bytes())
    symlink = Manifest("symlink", stat.S_IFLNK | 0o777, 0, 0, 0, 0, target="x")
    assert "rdev" not in json.loads(symlink.to_bytes())
    with pytest.raises(ManifestError):
        Manifest.from_bytes(Manifest("special", stat.S_IFREG | 0o644, 0, 0, 0, 0).to_bytes())


@pytest.mark.s3
def test_a_listing_read_concurrently_equals_one_read_in_order(mount_factory, monkeypatch):
    """On S3 a listing reads its manifests and markers several at a time: same entries, same order."""
    from nvfs.backend import open_backend
    from nvfs.codec import CpuEngine
    from nvfs.store import Store

    mount = mount_factory(backend="s3")
    template = _store_with_files(mount)
    for n in range(40):
        _put(mount, f"tree/d/f{n:02}", _crafted(template, mtime_ns=n))
    for n in range(5):
        _put(mount, f"tree/d/sub{n}/#dir", json.dumps(
            {"nvfs": 1, "type": "dir", "mode": stat.S_IFDIR | 0o700 + n, "uid": n, "gid": 0,
             "mtime_ns": n, "ctime_ns": n}).encode())
    _put(mount, "tree/d/#x2f", _crafted(template))
    _put(mount, "tree/d/bad", b"not json")
    for name, value in mount.s3.environ().items():
        monkeypatch.setenv(name, value)
    store = Store.open(open_backend(mount.url, {"endpoint_url": mount.s3.endpoint_url}), CpuEngine())
    try:
        concurrent = store.list_dir(("d",))
        monkeypatch.setattr(store.backend, "shared", False)  # one read after another
        store.namespace._manifests.clear()
        in_order = store.list_dir(("d",))
    finally:
        store.close()
    assert list(concurrent.items()) == list(in_order.items())
    assert set(concurrent) == {"good.bin", "good.txt", *(f"f{n:02}" for n in range(40)),
                               *(f"sub{n}" for n in range(5))}
    assert [concurrent[f"sub{n}"].uid for n in range(5)] == list(range(5))
