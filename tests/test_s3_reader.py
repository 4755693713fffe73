"""The S3 backend's lean chunk GETs (nvfs/backend/s3_reader.py), against a real SeaweedFS.

Mount-level behaviour (restores, damaged and missing chunks as EIO) is covered through the
mounts in test_s3.py and the backend-parameterised tests; these check the reader's own
promises: whole objects, a missing one reported as missing, a dead endpoint reported after
bounded retries instead of a hang, pooled connections replaced after the server restarts, and
requests that another process signs.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import time

import pytest
from botocore.credentials import ReadOnlyCredentials

from nvfs.backend import s3_reader
from nvfs.backend.errors import BackendError, ObjectNotFound
from nvfs.backend.http_get import ObjectGetter
from nvfs.backend.s3 import S3Backend
from nvfs.testing.seaweed import SeaweedServer

pytestmark = pytest.mark.s3


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


def test_a_request_is_signed_by_whoever_sends_it(reader_backend):
    """A fetch process signs the GET the daemon made: the request travels pickled, unsigned."""
    data = os.urandom(1 << 20)
    reader_backend.put("chunks/ef/ef01", data, durable=True)
    request = pickle.loads(pickle.dumps(reader_backend.chunk_request("chunks/ef/ef01")))
    getter = ObjectGetter(request.settings)
    try:
        assert getter.get(request.key, request.path, request.headers()) == data
        forged = dataclasses.replace(request, credentials=ReadOnlyCredentials("nobody", "wrong", None))
        with pytest.raises(BackendError, match="HTTP 403"):
            getter.get(forged.key, forged.path, forged.headers())  # the server checks signatures
    finally:
        getter.close()


def test_requests_made_without_waiting_reuse_recent_credentials_only(reader_backend, monkeypatch):
    """On the event loop a request must not look credentials up: a refresh can go to the network."""
    assert reader_backend.chunk_request("chunks/ab/x", wait=False) is not None  # looked up at start
    monkeypatch.setattr(s3_reader, "CREDENTIALS_REUSE", -1.0)  # as if a minute had passed
    assert reader_backend.chunk_request("chunks/ab/x", wait=False) is None
    assert reader_backend.chunk_request("chunks/ab/x") is not None  # a worker thread looks them up
