"""A backend on any S3-compatible object store (AWS, SeaweedFS, MinIO, Ceph RGW, StorageGRID).

Object ``k`` is the S3 object ``<prefix>/k`` in the bucket. Credentials come from boto3's
standard chain (environment, shared config and credential files, instance roles); nvfs
never takes them as options, so they never show in ``ps`` or in logs.

S3 puts are atomic and durable when they return, so ``sync`` has nothing to do. Renames
are copy-then-delete and not atomic; nvfs renames only manifests (small objects).
Several mounts may share a bucket: the backend is ``shared``, which makes the store
re-upload chunks instead of trusting that an existing one survives, and keeps garbage
collection away from young chunks.
"""

from __future__ import annotations

import contextlib
import logging
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from nvfs.backend.base import Backend, BackendError, ObjectNotFound
from nvfs.backend.http_get import ObjectGet
from nvfs.backend.s3_reader import ObjectReader

log = logging.getLogger(__name__)

_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}


@contextlib.contextmanager
def _failures(operation: str, key: str) -> Iterator[None]:
    """Report S3 failures as backend errors; a missing object as :class:`ObjectNotFound`."""
    try:
        yield
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in _NOT_FOUND:
            raise ObjectNotFound(key) from None
        raise BackendError(f"{operation} {key}: {exc}") from exc
    except BotoCoreError as exc:
        raise BackendError(f"{operation} {key}: {exc}") from exc


class S3Backend(Backend):
    """Objects under ``s3://bucket/prefix``."""

    shared = True

    def __init__(self, url: str, *, endpoint_url: str | None = None, region: str | None = None,
                 profile: str | None = None, connect_timeout: float = 5.0, read_timeout: float = 60.0,
                 max_attempts: int = 5, max_connections: int = 64) -> None:
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not bucket:
            raise BackendError(f"{url}: no bucket name (expected s3://bucket/prefix)")
        self.url = url
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        config = Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"max_attempts": max_attempts, "mode": "standard"},
            max_pool_connections=max_connections,
            s3={"addressing_style": "path"} if endpoint_url else None,
            response_checksum_validation="when_required",  # asked for per GET: see get()
        )
        try:
            session = boto3.Session(profile_name=profile, region_name=region)
            self._client = session.client("s3", endpoint_url=endpoint_url, config=config)
        except BotoCoreError as exc:
            raise BackendError(f"{url}: {exc}") from exc
        self._check_bucket()
        self._reader = self._chunk_reader(session, connect_timeout=connect_timeout,
                                          read_timeout=read_timeout, max_attempts=max_attempts)

    def _check_bucket(self) -> None:
        """Fail at mount time, with a plain reason, rather than on the first write."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except NoCredentialsError:
            raise BackendError(f"{self.url}: no AWS credentials (environment, profile or role)") from None
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchBucket", "NotFound"):
                raise BackendError(f"{self.url}: bucket {self.bucket!r} does not exist") from None
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise BackendError(f"{self.url}: access denied (check the credentials)") from None
            raise BackendError(f"{self.url}: {code or exc}") from None
        except BotoCoreError as exc:
            raise BackendError(f"{self.url}: cannot reach the endpoint: {exc}") from None

    def _chunk_reader(self, session: boto3.Session, **settings: float) -> ObjectReader | None:
        """The lean GET path for chunk objects (nvfs/backend/s3_reader.py), where it applies.

        It reaches the endpoint the client would (its presigned URL says where), with the
        session's credentials and CA bundle; through a proxy, chunks go through boto3 instead.
        """
        base_url = ObjectReader.base_url_of(lambda key: self._client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=60))
        credentials = session.get_credentials()
        if base_url is None or credentials is None:
            return None
        parts = urllib.parse.urlsplit(base_url)
        proxied = parts.scheme in urllib.request.getproxies()
        if proxied and not urllib.request.proxy_bypass(parts.hostname or ""):
            log.info("%s: chunk GETs go through boto3 (a proxy is configured)", self.url)
            return None
        reader = ObjectReader(base_url, self._client.meta.region_name, credentials.get_frozen_credentials,
                              ca_bundle=session._session.get_config_variable("ca_bundle"), **settings)
        # boto3 follows a bucket's region redirects; the reader does not. A GET of a key that
        # does not exist must come back "not found": a wrong region or endpoint, or a policy
        # that hides missing keys, leaves chunks to boto3.
        try:
            reader.get(self._key(ObjectReader.PROBE_KEY))
        except ObjectNotFound:
            return reader
        except BackendError as exc:
            log.info("%s: chunk GETs go through boto3 (a direct GET answered: %s)", self.url, exc)
            reader.close()
            return None
        return reader

    def describe(self) -> str:
        return self.url

    def _key(self, key: str) -> str:
        return self.prefix + key

    def get(self, key: str, *, content_addressed: bool = False) -> bytes | memoryview:
        # A CRC of a chunk costs a fifth of the client's CPU on a restore, and the store
        # verifies each chunk's hash anyway; other objects (manifests) are checked.
        if content_addressed and self._reader is not None:
            return self._reader.get(self._key(key))
        checks = {} if content_addressed else {"ChecksumMode": "ENABLED"}
        with _failures("GET", key):
            return self._client.get_object(Bucket=self.bucket, Key=self._key(key), **checks)["Body"].read()

    def chunk_request(self, key: str, *, wait: bool = True) -> ObjectGet | None:
        return self._reader.request(self._key(key), wait=wait) if self._reader is not None else None

    def put(self, key: str, data: bytes, *, durable: bool) -> None:
        with _failures("PUT", key):
            self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def delete(self, key: str) -> None:
        with _failures("DELETE", key):
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def exists(self, key: str) -> bool:
        try:
            with _failures("HEAD", key):
                self._client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ObjectNotFound:
            return False
        return True

    def _pages(self, prefix: str, delimiter: str | None) -> Iterator[dict]:
        arguments = {"Bucket": self.bucket, "Prefix": self._key(prefix)}
        if delimiter:
            arguments["Delimiter"] = delimiter
        with _failures("LIST", prefix):
            yield from self._client.get_paginator("list_objects_v2").paginate(**arguments)

    def list_dir(self, prefix: str) -> tuple[dict[str, str], list[str]]:
        objects: dict[str, str] = {}
        prefixes: list[str] = []
        start = len(self._key(prefix))
        for page in self._pages(prefix, "/"):
            for item in page.get("Contents", []):
                if item["Key"][start:]:
                    objects[item["Key"][start:]] = item.get("ETag") or str(item["LastModified"])
            prefixes.extend(item["Prefix"][start:].rstrip("/") for item in page.get("CommonPrefixes", []))
        return objects, prefixes

    def iter_objects(self, prefix: str) -> Iterator[tuple[str, float]]:
        start = len(self.prefix)
        for page in self._pages(prefix, None):
            for item in page.get("Contents", []):
                modified: datetime = item["LastModified"]
                yield item["Key"][start:], modified.timestamp()

    def rename(self, src: str, dst: str) -> None:
        with _failures("COPY", src):
            self._client.copy_object(Bucket=self.bucket, Key=self._key(dst),
                                     CopySource={"Bucket": self.bucket, "Key": self._key(src)})
        self.delete(src)

    def rename_prefix(self, src: str, dst: str) -> None:
        for key in list(self.iter_keys(src)):
            self.rename(key, dst + key[len(src):])

    def sync(self) -> None:
        """Nothing to do: an S3 put is durable when it returns."""

    def is_empty(self) -> bool:
        for page in self._pages("", None):
            return not page.get("Contents")
        return True

    def lock(self) -> None:
        """Several mounts may share a bucket; there is nothing to lock."""

    def capacity(self) -> tuple[int, int] | None:
        return None

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
