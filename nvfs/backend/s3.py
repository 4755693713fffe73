"""A backend on any S3-compatible object store (AWS, SeaweedFS, MinIO, Ceph RGW, StorageGRID).

Object ``k`` is the S3 object ``<prefix>/k`` in the bucket. Credentials come from boto3's
standard chain (environment, shared config and credential files, instance roles); nvfs
never takes them as options, so they never show in ``ps`` or in logs.

S3 puts are atomic and durable when they return, so ``sync`` has nothing to do. A rename
is a copy then a delete; a directory's rename is recorded first as an intent that any later
mount finishes (:mod:`nvfs.backend.s3_journal`). Every request has a deadline
(:mod:`nvfs.backend.deadlines`), and metadata requests (manifests, listings, renames) have a
client and connections of their own, so they never queue behind chunk transfers.
Several mounts may share a bucket: the backend is ``shared``, which makes the store
re-upload chunks instead of trusting that an existing one survives, and keeps garbage
collection away from young chunks.
"""

from __future__ import annotations

import logging
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, NoCredentialsError
from botocore.exceptions import ConnectionError as BotoConnectionError

from nvfs.backend.base import Backend, ListedObject
from nvfs.backend.deadlines import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT,
    Deadlines,
    Retry,
    is_transient,
    time_left,
    with_retries,
)
from nvfs.backend.errors import BackendError, ObjectNotFound
from nvfs.backend.object_get import ObjectGet
from nvfs.backend.s3_journal import (
    INTENT_LIMIT,
    JOURNAL_PREFIX,
    RENAME_INTENT,
    BadIntent,
    new_intent_key,
    parse_intent,
    rename_intent,
)
from nvfs.backend.s3_reader import ObjectReader

log = logging.getLogger(__name__)

_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
BULK_KEYS = "chunks/"  # the store's chunk objects: bulk transfers, on a client of their own
_METADATA_CONNECTIONS = 16  # metadata requests are small and few at a time; renames copy 8 at once
_RENAME_COPIERS = 8  # copies in flight in a directory rename: each copy is a round trip, not work here
_DELETE_BATCH = 1000  # keys per DeleteObjects request: S3's limit


def _attempt_failure(exc: Exception, operation: str, key: str) -> Exception:
    """What a failed boto3 call becomes: :class:`Retry` if worth another go, else a backend error."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in _NOT_FOUND:
            return ObjectNotFound(key)
        if is_transient(status, code):
            return Retry(f"{code or status}: {error.get('Message', '')}".rstrip(": "))
        return BackendError(f"{operation} {key}: {exc}")
    if isinstance(exc, (BotoConnectionError, HTTPClientError)):
        return Retry(str(exc))
    return BackendError(f"{operation} {key}: {exc}")


class S3Backend(Backend):
    """Objects under ``s3://bucket/prefix``."""

    shared = True

    def __init__(self, url: str, *, endpoint_url: str | None = None, region: str | None = None,
                 profile: str | None = None, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 read_timeout: float = DEFAULT_READ_TIMEOUT, request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 max_attempts: int = DEFAULT_MAX_ATTEMPTS, max_connections: int = 64) -> None:
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not bucket:
            raise BackendError(f"{url}: no bucket name (expected s3://bucket/prefix)")
        self.url = url
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.deadlines = Deadlines(connect_timeout, read_timeout, request_timeout, max_attempts)
        try:
            self.deadlines.check()
            session = boto3.Session(profile_name=profile, region_name=region)
            self._client = self._new_client(session, endpoint_url, _METADATA_CONNECTIONS)
            self._bulk = self._new_client(session, endpoint_url, max_connections)
        except (BotoCoreError, ValueError) as exc:
            raise BackendError(f"{url}: {exc}") from exc
        self._check_bucket()
        self._reader = self._chunk_reader(session)

    def _new_client(self, session: boto3.Session, endpoint_url: str | None, connections: int) -> Any:
        """A client whose every attempt is bounded; retries are :func:`with_retries`' (one deadline)."""
        config = Config(
            connect_timeout=self.deadlines.connect,
            read_timeout=self.deadlines.read,
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=connections,
            s3={"addressing_style": "path"} if endpoint_url else None,
            response_checksum_validation="when_required",  # asked for per GET: see get()
        )
        return session.client("s3", endpoint_url=endpoint_url, config=config)

    def _check_bucket(self) -> None:
        """Fail at mount time, with a plain reason, rather than on the first write."""
        try:
            self._call(self._client.head_bucket, "HEAD", "bucket", Bucket=self.bucket)
        except ObjectNotFound:
            raise BackendError(f"{self.url}: bucket {self.bucket!r} does not exist") from None
        except BackendError as exc:
            cause = exc.__cause__
            if isinstance(cause, NoCredentialsError):
                raise BackendError(f"{self.url}: no AWS credentials (environment, profile or role)") from None
            code = cause.response.get("Error", {}).get("Code", "") if isinstance(cause, ClientError) else ""
            if code == "NoSuchBucket":
                raise BackendError(f"{self.url}: bucket {self.bucket!r} does not exist") from None
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise BackendError(f"{self.url}: access denied (check the credentials)") from None
            if code:
                raise BackendError(f"{self.url}: {code}") from None
            raise BackendError(f"{self.url}: cannot reach the endpoint: {exc}") from None

    def _call(self, method: Callable[..., Any], operation: str, key: str, **arguments: Any) -> Any:
        """``method(**arguments)`` within the request's deadline, retried as the deadlines allow."""

        def attempt(_deadline: float) -> Any:
            try:
                return method(**arguments)
            except (ClientError, BotoCoreError) as exc:
                raise _attempt_failure(exc, operation, key) from exc

        return with_retries(f"{operation} {key}", self.deadlines, attempt, clipped=False)

    def _chunk_reader(self, session: boto3.Session) -> ObjectReader | None:
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
                              ca_bundle=session._session.get_config_variable("ca_bundle"),
                              deadlines=self.deadlines)
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

    def _client_for(self, key: str) -> Any:
        return self._bulk if key.startswith(BULK_KEYS) else self._client

    def get(self, key: str, *, content_addressed: bool = False) -> bytes | memoryview:
        # A CRC of a chunk costs a fifth of the client's CPU on a restore, and the store
        # verifies each chunk's hash anyway; other objects (manifests) are checked.
        if content_addressed and self._reader is not None:
            return self._reader.get(self._key(key))
        checks = {} if content_addressed else {"ChecksumMode": "ENABLED"}
        return self._read(key, checks)

    def _read(self, key: str, arguments: dict[str, str]) -> bytes:
        """The object's body (or the part ``arguments`` ask for), its transfer within the deadline."""
        client = self._client_for(key)

        def attempt(deadline: float) -> bytes:
            try:
                body = client.get_object(Bucket=self.bucket, Key=self._key(key), **arguments)["Body"]
                body.set_socket_timeout(time_left(deadline, self.deadlines.read))
                return body.read()
            except (ClientError, BotoCoreError) as exc:
                raise _attempt_failure(exc, "GET", key) from exc

        return with_retries(f"GET {key}", self.deadlines, attempt, clipped=False)

    def chunk_request(self, key: str, *, wait: bool = True) -> ObjectGet | None:
        return self._reader.request(self._key(key), wait=wait) if self._reader is not None else None

    def put(self, key: str, data: bytes, *, durable: bool) -> None:
        self._call(self._client_for(key).put_object, "PUT", key, Bucket=self.bucket, Key=self._key(key),
                   Body=data)

    def delete(self, key: str) -> None:
        self._call(self._client_for(key).delete_object, "DELETE", key, Bucket=self.bucket,
                   Key=self._key(key))

    def exists(self, key: str) -> bool:
        try:
            self._call(self._client_for(key).head_object, "HEAD", key, Bucket=self.bucket, Key=self._key(key))
        except ObjectNotFound:
            return False
        return True

    def _pages(self, prefix: str, delimiter: str | None) -> Iterator[dict]:
        """The pages of a listing, each request within its own deadline."""
        arguments = {"Bucket": self.bucket, "Prefix": self._key(prefix)}
        if delimiter:
            arguments["Delimiter"] = delimiter
        while True:
            page = self._call(self._client.list_objects_v2, "LIST", prefix, **arguments)
            yield page
            if not page.get("IsTruncated") or not page.get("NextContinuationToken"):
                return
            arguments["ContinuationToken"] = page["NextContinuationToken"]

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

    def iter_objects(self, prefix: str) -> Iterator[ListedObject]:
        start = len(self.prefix)
        for page in self._pages(prefix, None):
            for item in page.get("Contents", []):
                modified: datetime = item["LastModified"]
                # An ETag is the digest of the object's bytes; a listing without one gives no
                # version (LastModified has whole seconds: a replacement may keep it).
                yield ListedObject(item["Key"][start:], modified.timestamp(), item.get("ETag", ""))

    def rename(self, src: str, dst: str) -> None:
        self._copy(src, dst)
        self.delete(src)

    def _copy(self, src: str, dst: str) -> None:
        self._call(self._client.copy_object, "COPY", src, Bucket=self.bucket, Key=self._key(dst),
                   CopySource={"Bucket": self.bucket, "Key": self._key(src)})

    def rename_prefix(self, src: str, dst: str) -> None:
        """Move a directory: an intent first, so that a crash part-way leaves a move any mount finishes."""
        intent = new_intent_key()
        self.put(intent, rename_intent(src, dst), durable=True)
        self._move_prefix(src, dst)
        self.delete(intent)

    def _move_prefix(self, src: str, dst: str) -> None:
        """Copy every object under ``src`` to ``dst``, then delete the originals; safe to run again.

        All copies come before any delete, so until the last copy is made ``src`` is whole,
        and from then on ``dst`` is. A source gone meanwhile (moved by another mount that
        finishes the same intent) is skipped.
        """
        keys = list(self.iter_keys(src))
        with ThreadPoolExecutor(_RENAME_COPIERS, thread_name_prefix="nvfs-rename") as copiers:
            for _done in copiers.map(lambda key: self._copy_if_there(key, dst + key[len(src):]), keys):
                pass
        for start in range(0, len(keys), _DELETE_BATCH):
            self._delete_many(keys[start : start + _DELETE_BATCH])

    def _copy_if_there(self, src: str, dst: str) -> None:
        try:
            self._copy(src, dst)
        except ObjectNotFound:
            log.debug("%s is gone: already moved to %s", src, dst)

    def _delete_many(self, keys: list[str]) -> None:
        """Delete ``keys`` in one request; a key already gone is not an error."""
        if not keys:
            return
        objects = [{"Key": self._key(key)} for key in keys]
        answer = self._call(self._client.delete_objects, "DELETE", f"{keys[0]} and {len(keys) - 1} more",
                            Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})
        failed = [error for error in answer.get("Errors", []) if error.get("Code") not in _NOT_FOUND]
        if failed:
            raise BackendError(f"DELETE {failed[0].get('Key')}: {failed[0].get('Code')} "
                               f"{failed[0].get('Message', '')} ({len(failed)} keys not deleted)")

    def discard_incomplete(self) -> None:
        """Finish every directory rename whose intent a crash (or a failed request) left behind.

        An intent that does not parse is reported and left alone; one whose move fails now is
        reported and left for the next mount.
        """
        for key in list(self.iter_keys(JOURNAL_PREFIX)):
            try:
                src, dst = self._intent(key)
            except ObjectNotFound:
                continue  # another mount finished it meanwhile
            except BadIntent as exc:
                log.error("%s%s is not a rename intent nvfs can follow (%s): left alone",
                          self.prefix, key, exc)
                continue
            log.warning("finishing an interrupted rename of %s to %s (%s)", src, dst, key)
            try:
                self._move_prefix(src, dst)
                self.delete(key)
            except BackendError as exc:
                log.error("the rename %s records could not be finished now (%s): the next mount tries again",
                          key, exc)

    def _intent(self, key: str) -> tuple[str, str]:
        if not key.startswith(RENAME_INTENT):
            raise BadIntent("an unknown kind of journal object")
        return parse_intent(self._read(key, {"Range": f"bytes=0-{INTENT_LIMIT - 1}"}))

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
