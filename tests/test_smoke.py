import os

import pytest

pytestmark = [pytest.mark.fuse, pytest.mark.smoke]


def test_write_read_remount(mounted):
    path = mounted.path / "hello.txt"
    path.write_bytes(b"hello nvfs\n" * 1000)
    assert path.read_bytes() == b"hello nvfs\n" * 1000
    mounted.remount()
    assert path.read_bytes() == b"hello nvfs\n" * 1000
    assert os.path.getsize(path) == 11000
