"""Deadlines on S3 requests: a frozen server gives EIO in bounded time, and the mount lives on.

The server is stopped with SIGSTOP: it still accepts connections (the kernel queues them)
but never answers, which no connection error reports; only the deadlines end such requests.
"""

from __future__ import annotations

import concurrent.futures
import errno
import os
import re
import signal
import time

import pytest

from nvfs.options import OptionError, parse_options
from tests.conftest import Mount, nvfs, wait_until

pytestmark = [pytest.mark.fuse, pytest.mark.s3]

MIB = 1 << 20
REQUEST_TIMEOUT = 4.0  # seconds: the whole of one request, its retries included
DEADLINES = ("connect_timeout=1", "read_timeout=2", f"request_timeout={REQUEST_TIMEOUT:g}")
# Seconds past the deadline a reader may wait for its EIO: the fetch under way when the server
# froze began up to a deadline before the reader's read, and the reply travels through FUSE.
MARGIN = 3.0


def _signal_server(server, sig: signal.Signals) -> None:
    os.killpg(os.getpgid(server.pid), sig)


def _reads_back(path, data: bytes) -> bool:
    """Whether the file reads back as ``data``; ``False`` while reading it fails."""
    try:
        return path.read_bytes() == data
    except OSError:
        return False


@pytest.mark.parametrize("fetch_procs", [0, 1])
def test_frozen_server_gives_eio_within_the_deadline(tmp_path, own_server, request, fetch_procs):
    (tmp_path / "m").mkdir()
    mount = Mount(tmp_path / "m", (f"fetch_procs={fetch_procs}", "chunk_size=1M", *DEADLINES), s3=own_server)
    request.addfinalizer(mount.force_cleanup)
    mount.mount()
    data = os.urandom(24 * MIB)
    (mount.path / "ckpt.bin").write_bytes(data)
    mount.remount()  # nothing of the file in memory: every chunk comes from the server
    assert os.listdir(mount.path) == ["ckpt.bin"]

    lister = concurrent.futures.ThreadPoolExecutor(1)
    request.addfinalizer(lambda: _signal_server(own_server, signal.SIGCONT))
    with open(mount.path / "ckpt.bin", "rb", buffering=0) as f:
        assert f.read(MIB) == data[:MIB]  # a cold read is under way: read-ahead fetches the next chunks
        _signal_server(own_server, signal.SIGSTOP)
        frozen = time.monotonic()
        with pytest.raises(OSError) as failure:
            while f.read(MIB):
                pass
        waited = time.monotonic() - frozen
        assert failure.value.errno == errno.EIO
        assert waited < REQUEST_TIMEOUT + MARGIN, f"EIO came {waited:.1f} s after the server froze"
        # The mount still answers about its namespace while the server is frozen.
        for _ in range(3):
            began = time.monotonic()
            assert lister.submit(os.listdir, mount.path).result(timeout=60) == ["ckpt.bin"]
            assert time.monotonic() - began < REQUEST_TIMEOUT + MARGIN
    log = mount.log()
    assert re.search(r"could not be read: GET \S*chunks/\S+: .*request_timeout 4 s", log), log[-3000:]

    _signal_server(own_server, signal.SIGCONT)
    wait_until(lambda: _reads_back(mount.path / "ckpt.bin", data), "the mount reads again", timeout=60)
    lister.shutdown()


@pytest.mark.parametrize(("option", "message"), [
    ("request_timeout=3", "request_timeout (3 s) must be at least connect_timeout + read_timeout (25 s)"),
    ("connect_timeout=0", "connect_timeout=0 is out of range (0.1..600 seconds)"),
    ("read_timeout=soon", "read_timeout takes seconds, not 'soon'"),
    ("request_timeout=nan", "request_timeout=nan is out of range (1..86400 seconds)"),
    ("request_timeout", "request_timeout needs a value"),
    ("max_file_size=1k", "max_file_size=1024 is out of range (1048576..1125899906842624)"),
    ("max_file_size=2P", "max_file_size=2251799813685248 is out of range (1048576..1125899906842624)"),
    ("max_file_size=big", "max_file_size: 'big' is not a size"),
])
def test_bad_deadline_and_size_options_are_refused_in_one_line(tmp_path, option, message):
    with pytest.raises(OptionError, match=re.escape(message)):
        parse_options([option])
    (tmp_path / "mnt").mkdir()
    result = nvfs("mount", "s3://bucket/store", str(tmp_path / "mnt"), "-o", option, timeout=60)
    assert result.returncode != 0
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_deadline_and_size_options_are_taken():
    options = parse_options(["connect_timeout=0.5,read_timeout=1.5", "request_timeout=2,max_file_size=1T"])
    assert options.backend == {"connect_timeout": 0.5, "read_timeout": 1.5, "request_timeout": 2.0}
    assert options.vfs.max_file_size == 1 << 40
    assert parse_options([]).vfs.max_file_size == 16 << 40
    assert parse_options(["max_file_size=1P"]).vfs.max_file_size == 1 << 50
