"""The S3 backend's lean chunk GETs (nvfs/backend/s3_reader.py), against a real SeaweedFS.

Mount-level behaviour (restores, damaged and missing chunks as EIO) is covered through the
mounts in test_s3.py and the backend-parameterised tests; these check the reader's own
promises: whole objects, a missing one reported as missing, a dead endpoint reported after
bounded retries instead of a hang, and pooled connections replaced after the server restarts.
"""

from __future__ import annotations

import os
import time

import pytest

from nvfs.backend.base import BackendError, ObjectNotFound
from nvfs.backend.s3 import S3Backend
from tests.seaweed import SeaweedServer


@pytest.fixture(params=["prefix", "run 1/ü+%x"])
def reader_backend(own_server: SeaweedServer, monkeypatch, request) -> S3Backend:
    """A backend whose prefix is plain, or has characters that the signed path must encode."""
    for name, value in own_server.environ().items():
        monkeypatch.setenv(name, value)
    own_server.create_bucket("reader")
    backend = S3Backend(f"s3://reader/{request.param}", endpoint_url=own_server.endpoint_url,
                        max_attempts=3)
    yield backend
    backend.close()


def test_chunks_come_whole_and_missing_ones_are_reported(reader_backend):
    data = os.urandom((3 << 20) + 17)
    reader_backend.put("chunks/ab/abcd", data, durable=True)
    got = reader_backend.get("chunks/ab/abcd", content_addressed=True)
    assert isinstance(got, memoryview), "chunk GETs should bypass the boto3 client"
    assert got == data
    assert reader_backend.get("chunks/ab/abcd") == data  # other objects go through boto3, checksummed
    with pytest.raises(ObjectNotFound):
        reader_backend.get("chunks/ab/missing", content_addressed=True)


def test_dead_endpoint_fails_after_retries_then_recovers(reader_backend, own_server):
    data = os.urandom(1 << 20)
    reader_backend.put("chunks/cd/cdef", data, durable=True)
    assert reader_backend.get("chunks/cd/cdef", content_addressed=True) == data  # leaves a pooled connection
    own_server.stop(timeout=0)
    started = time.monotonic()
    with pytest.raises(BackendError, match="after 3 attempts"):
        reader_backend.get("chunks/cd/cdef", content_addressed=True)
    assert time.monotonic() - started < 30
    own_server.start()
    assert reader_backend.get("chunks/cd/cdef", content_addressed=True) == data
