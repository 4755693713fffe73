"""Name and path limits on a real mount: NAME_MAX (255 bytes) and the store's 1024-byte key limit.

Every way of making a name -- create, mkdir, symlink, mknod, rename -- answers a name or a path
that does not fit with ENAMETOOLONG, before anything is stored, never EIO.
"""

from __future__ import annotations

import errno
import os
import stat

import pytest

pytestmark = pytest.mark.fuse

NAME_MAX = 255
KEY_MAX = 1024
COMPONENT = "d" * 200


def _expect_too_long(fn, *args) -> None:
    with pytest.raises(OSError) as info:
        fn(*args)
    assert info.value.errno == errno.ENAMETOOLONG, f"{fn.__name__}: {info.value!r}"


def _make_every_kind(directory, name: str) -> None:
    """A file, a directory, a symlink and a fifo named ``name`` + a suffix of one letter each."""
    (directory / (name[:-1] + "f")).write_bytes(b"f")
    (directory / (name[:-1] + "d")).mkdir()
    os.symlink("f", directory / (name[:-1] + "l"))
    os.mkfifo(directory / (name[:-1] + "p"))


def _refuse_every_kind(directory, name: str, existing) -> None:
    _expect_too_long(open, directory / name, "wb")
    _expect_too_long(os.mkdir, directory / name)
    _expect_too_long(os.symlink, "f", directory / name)
    _expect_too_long(os.mkfifo, directory / name)
    _expect_too_long(os.mknod, directory / name, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    _expect_too_long(os.rename, existing, directory / name)


def test_names_of_255_bytes_work_and_longer_ones_are_refused(mounted):
    os.makedirs(mounted.path / "names")
    root = mounted.path / "names"
    _make_every_kind(root, "x" * NAME_MAX)
    _make_every_kind(root, "ü" * 127 + "z")  # 255 bytes of UTF-8
    (root / "short").write_bytes(b"s")
    os.rename(root / "short", root / ("r" * NAME_MAX))
    assert os.statvfs(mounted.path).f_namemax == NAME_MAX

    _refuse_every_kind(root, "y" * (NAME_MAX + 1), root / ("r" * NAME_MAX))
    _refuse_every_kind(root, "#" * NAME_MAX, root / ("r" * NAME_MAX))  # its key component is 256 bytes
    assert sorted(os.listdir(root)) == sorted(
        [*(("x" * 254) + kind for kind in "fdlp"), *(("ü" * 127) + kind for kind in "fdlp"), "r" * NAME_MAX])

    mounted.remount()
    assert (root / ("x" * 254 + "f")).read_bytes() == b"f"
    assert stat.S_ISFIFO(os.lstat(root / ("x" * 254 + "p")).st_mode)
    assert (root / ("r" * NAME_MAX)).read_bytes() == b"s"


def _key_budget(mount, directory_components: int) -> int:
    """The longest name whose manifest key fits in a directory ``directory_components`` deep.

    Keys are ``tree/<c1>/.../<name>`` behind the bucket prefix (``store/``) on S3.
    """
    prefix = len("store/") if mount.s3 is not None else 0
    return KEY_MAX - prefix - len("tree/") - directory_components * (len(COMPONENT) + 1)


def test_paths_whose_store_key_is_too_long_are_refused(mounted):
    deep = mounted.path.joinpath(*[COMPONENT] * 4)
    deep.mkdir(parents=True)
    longest = _key_budget(mounted, 4)
    assert 0 < longest < NAME_MAX
    (deep / ("f" * longest)).write_bytes(b"fits")
    os.symlink("target", deep / ("l" * longest))
    os.mkfifo(deep / ("p" * longest))
    (deep / ("d" * (longest - len("/#dir")))).mkdir()  # a directory's key is its marker's
    (mounted.path / "outside").write_bytes(b"o")

    over = longest + 1
    _refuse_every_kind(deep, "n" * over, mounted.path / "outside")
    _expect_too_long(os.mkdir, deep / ("d" * (over - len("/#dir"))))
    assert (mounted.path / "outside").read_bytes() == b"o"

    mounted.remount()
    assert (deep / ("f" * longest)).read_bytes() == b"fits"
    assert os.readlink(deep / ("l" * longest)) == "target"
    assert sorted(os.listdir(deep)) == sorted(["f" * longest, "l" * longest, "p" * longest,
                                               "d" * (longest - len("/#dir"))])


def test_renaming_a_directory_whose_entries_would_not_fit_is_refused(mounted):
    top = mounted.path / "a"
    deep = top.joinpath(*[COMPONENT] * 4)
    deep.mkdir(parents=True)
    name = "f" * (_key_budget(mounted, 4) - len("a/") - 10)  # its key fits with 10 bytes to spare
    (deep / name).write_bytes(b"deep")
    assert os.listdir(deep) == [name]
    _expect_too_long(os.rename, top, mounted.path / ("a" * 20))
    os.rename(top, mounted.path / ("a" * 11))  # 10 bytes longer: still fits
    assert (mounted.path.joinpath("a" * 11, *[COMPONENT] * 4) / name).read_bytes() == b"deep"
