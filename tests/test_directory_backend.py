"""The directory backend on its own: objects as files, directories made and pruned as needed."""

from __future__ import annotations

import os
import threading

import pytest

from nvfs.backend import ObjectNotFound
from nvfs.backend.directory import DirectoryBackend

pytestmark = pytest.mark.unit


@pytest.fixture
def backend(tmp_path):
    store = DirectoryBackend(str(tmp_path))
    yield store
    store.close()


@pytest.mark.parametrize("size", [100, 3 << 20])  # through the page cache, and O_DIRECT plus a tail
def test_put_makes_directories_and_get_returns_the_bytes(backend, size):
    data = os.urandom(size)
    backend.put("chunks/ab/cd/abcd", data, durable=False)
    assert backend.get("chunks/ab/cd/abcd") == data
    assert (backend.root / "chunks" / "ab" / "cd" / "abcd").is_file()


@pytest.mark.parametrize("durable", [False, True])  # O_DIRECT plus a tail, and through the page cache
def test_put_parts_stores_them_back_to_back(backend, durable):
    parts = [os.urandom(72), memoryview(os.urandom(3 << 20))[5:], bytearray(os.urandom(4099))]
    backend.put_parts("chunks/ab/cd/abcd", parts, durable=durable)
    assert backend.get("chunks/ab/cd/abcd") == b"".join(parts)


def test_delete_prunes_empty_directories_and_a_later_put_makes_them_again(backend):
    backend.put("chunks/ab/cd/abcd", b"one", durable=False)
    backend.delete("chunks/ab/cd/abcd")
    assert not (backend.root / "chunks").exists()
    with pytest.raises(ObjectNotFound):
        backend.get("chunks/ab/cd/abcd")
    backend.put("chunks/ab/cd/abcd", b"two", durable=True)
    assert backend.get("chunks/ab/cd/abcd") == b"two"


def test_put_after_the_temporary_directory_was_removed(backend):
    backend.put("first", b"makes .tmp", durable=False)
    (backend.root / ".tmp").rmdir()
    backend.put("manifest", b"still stored", durable=True)
    assert backend.get("manifest") == b"still stored"


def test_puts_survive_a_collector_pruning_the_same_directories(backend):
    """A put whose directory is pruned before its rename makes the directory again.

    One thread stores an object in each of a run of fresh directories; another puts and
    deletes a second object in the same directories, and every delete that empties a
    directory prunes it, racing with the first thread's rename into it.
    """
    rounds = 1000

    def put_all() -> None:
        for index in range(rounds):
            backend.put(f"chunks/{index:04d}/kept", index.to_bytes(4, "little"), durable=False)

    def churn() -> None:
        for index in range(rounds):
            backend.put(f"chunks/{index:04d}/gone", b"x", durable=False)
            backend.delete(f"chunks/{index:04d}/gone")

    threads = [threading.Thread(target=put_all), threading.Thread(target=churn)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stored = [backend.get(f"chunks/{index:04d}/kept") for index in range(rounds)]
    assert stored == [index.to_bytes(4, "little") for index in range(rounds)]
    assert not any((backend.root / "chunks" / f"{index:04d}" / "gone").exists() for index in range(rounds))
