"""GETs of whole S3 objects into one buffer, without the boto3 client's per-call machinery.

A restore GETs thousands of multi-MiB chunk objects from worker threads of one Python
process, so what matters is how long each GET holds the GIL. py-spy ``--gil`` of a cold
``cat`` from SeaweedFS on 16 cores (3.4 s, 0.64 GB/s, GIL held 72% of the time): boto3's
``get_object`` held it for a fifth of that time (events, parsing, retry bookkeeping), and
reading the body another sixth (http.client's ``_safe_read`` grows the body through a
BytesIO, copying it holding the GIL).

Here a request is signed with botocore's own SigV4 signer and the credentials of the
boto3 session (so the standard chain, refreshes and session tokens work as in boto3), sent
on an idle HTTP/1.1 connection of a small pool, and its body read with ``readinto`` straight
into an uninitialised buffer: the socket reads run without the GIL and nothing is copied.
Failures are retried like boto3's standard mode: throttling, 5xx and dropped connections,
with jittered exponential backoff.
"""

from __future__ import annotations

import http.client
import logging
import random
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable

import numpy as np
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials

from nvfs.backend.base import BackendError, ObjectNotFound

log = logging.getLogger(__name__)

_RETRIED_STATUS = {429, 500, 502, 503, 504}
_ERROR_CODE = re.compile(rb"<Code>([^<]+)</Code>")
_BACKOFF_BASE = 0.1  # seconds before the first retry; doubled each time, jittered
_BACKOFF_CAP = 5.0
_IDLE_CONNECTIONS = 64


class ObjectReader:
    """Whole-object GETs from one bucket; thread-safe."""

    PROBE_KEY = "nvfs-url-probe"  # a key nvfs never writes

    def __init__(self, base_url: str, region: str, credentials: Callable[[], ReadOnlyCredentials], *,
                 connect_timeout: float, read_timeout: float, max_attempts: int,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"cannot GET from {base_url!r}")
        self._origin = f"{parts.scheme}://{parts.netloc}"
        self._base_path = parts.path
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._region = region
        self._credentials = credentials
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_attempts = max_attempts
        self._ssl_context = ssl_context or (ssl.create_default_context() if self._https else None)
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    @classmethod
    def base_url_of(cls, presign: Callable[[str], str]) -> str | None:
        """The URL that object keys are appended to, from a presigned URL of a probe key.

        The client's endpoint rules (path or virtual-host addressing, regional endpoints,
        a custom ``endpoint_url``) decide it; ``None`` if the URL is not of that shape.
        """
        url = presign(cls.PROBE_KEY).partition("?")[0]
        return url[: -len(cls.PROBE_KEY)] if url.endswith("/" + cls.PROBE_KEY) else None

    def get(self, key: str) -> memoryview:
        """The whole object ``key`` (its full name in the bucket)."""
        path = self._base_path + urllib.parse.quote(key, safe="/~")
        for attempt in range(1, self._max_attempts + 1):
            try:
                return self._get_once(key, path)
            except _Retry as reason:
                if attempt == self._max_attempts:
                    raise BackendError(f"GET {key}: {reason} (after {attempt} attempts)") from None
                delay = random.uniform(0, min(_BACKOFF_CAP, _BACKOFF_BASE * 2 ** (attempt - 1)))
                log.debug("GET %s: %s; retrying in %.2f s", key, reason, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _get_once(self, key: str, path: str) -> memoryview:
        connection = self._idle_connection()
        reused = connection is not None
        try:
            if connection is None:
                connection = self._connect()
            connection.request("GET", path, headers=self._signed_headers(path))
            response = connection.getresponse()
            if response.status == 200:
                body = self._read_body(response)
                self._release(connection, response)
                return body
            error = response.read()
            self._release(connection, response)
        except (OSError, http.client.HTTPException) as exc:
            if connection is not None:
                connection.close()
            if reused and not isinstance(exc, TimeoutError):
                return self._get_once(key, path)  # the server closed an idle connection: once more
            raise _Retry(f"connection failed: {exc}") from None
        match = _ERROR_CODE.search(error)
        code = match.group(1).decode(errors="replace") if match else ""
        if response.status == 404:
            raise ObjectNotFound(key)
        if response.status in _RETRIED_STATUS or "Throttl" in code or code == "SlowDown":
            raise _Retry(f"HTTP {response.status} {code}".rstrip())
        raise BackendError(f"GET {key}: HTTP {response.status} {code}".rstrip())

    def _signed_headers(self, path: str) -> dict[str, str]:
        request = AWSRequest(method="GET", url=self._origin + path)
        S3SigV4Auth(self._credentials(), "s3", self._region).add_auth(request)
        return dict(request.headers.items())

    @staticmethod
    def _read_body(response: http.client.HTTPResponse) -> memoryview:
        length = response.length
        if length is None:  # chunked transfer: no length to read into
            return memoryview(response.read())
        body = memoryview(np.empty(length, dtype=np.uint8))
        received = 0
        while received < length:
            count = response.readinto(body[received:])
            if not count:
                raise http.client.IncompleteRead(bytes(0), length - received)
            received += count
        return body

    def _idle_connection(self) -> http.client.HTTPConnection | None:
        with self._lock:
            return self._idle.pop() if self._idle else None

    def _connect(self) -> http.client.HTTPConnection:
        if self._https:
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                self._host, self._port, timeout=self._connect_timeout, context=self._ssl_context)
        else:
            connection = http.client.HTTPConnection(self._host, self._port, timeout=self._connect_timeout)
        connection.connect()
        assert connection.sock is not None
        connection.sock.settimeout(self._read_timeout)
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection

    def _release(self, connection: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        if response.will_close:
            connection.close()
            return
        with self._lock:
            if len(self._idle) < _IDLE_CONNECTIONS:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


class _Retry(Exception):
    """A failure worth another attempt."""
