"""Whole-object HTTP GETs into one buffer: the transport under the S3 chunk reader.

Kept apart from the signing (:mod:`nvfs.backend.s3_reader`), which whoever sends a request
does (:class:`nvfs.backend.object_get.ObjectGet`), here or in a fetch process. A body is read
with ``readinto`` straight into an uninitialised buffer: the socket reads run without the GIL
and nothing is copied. Failures are retried like boto3's standard mode
(:mod:`nvfs.backend.deadlines`), every wait cut to the request's deadline.
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
import threading
import time
import urllib.parse

import numpy as np

from nvfs.backend.deadlines import (
    RequestFailed,
    Retry,
    is_transient,
    time_left,
    with_retries,
)
from nvfs.backend.errors import BackendError, ObjectNotFound
from nvfs.backend.object_get import GetterSettings

_ERROR_CODE = re.compile(rb"<Code>([^<]+)</Code>")
_IDLE_CONNECTIONS = 64


class ObjectGetter:
    """GETs of whole objects from one origin, on a small pool of connections; thread-safe."""

    def __init__(self, settings: GetterSettings) -> None:
        parts = urllib.parse.urlsplit(settings.origin)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"cannot GET from {settings.origin!r}")
        self.settings = settings
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._ssl_context = ssl.create_default_context(cafile=settings.ca_bundle) if self._https else None
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._heard = time.monotonic()  # when the server last answered anything
        self._silent: str | None = None  # why the server is taken for silent; None while it answers
        self._probe_at = 0.0  # when a GET may next ask a silent server

    def get(self, key: str, path: str, headers: dict[str, str]) -> memoryview:
        """The whole object at ``path`` (``key`` names it in errors), sent with ``headers``.

        Every wait (connect, each socket read) is cut to what is left of the request's
        deadline, so a server that stops answering fails the GET by then. Signed headers stay
        valid for minutes, longer than any deadline the options allow.

        A GET that failed every attempt while the server answered nothing at all for
        ``read_timeout`` marks the server silent: GETs then fail at once, but for one probe
        every ``read_timeout``, until it answers again. Why: a reader retries a failed read
        straight away, behind the read-ahead's GETs, and each of them would otherwise wait out
        its own deadline on a server that is not there (a frozen server answered a reader's
        EIO after four deadlines instead of one).
        """
        self._wait_for_a_probe(key)
        try:
            return with_retries(f"GET {key}", self.settings.deadlines,
                                lambda deadline: self._get_once(key, path, headers, deadline), clipped=True)
        except RequestFailed as failure:
            self._note_silence(str(failure))
            raise

    def _wait_for_a_probe(self, key: str) -> None:
        """Fail at once while the server is silent, unless it is time to ask it again."""
        with self._lock:
            if self._silent is None:
                return
            now = time.monotonic()
            if now >= self._probe_at:
                self._probe_at = now + self.settings.read_timeout
                return
            silent_for = now - self._heard
        raise RequestFailed(f"GET {key}: the server has answered nothing for {silent_for:.0f} s "
                            f"(last failure: {self._silent}); asked again soon")

    def _note_silence(self, why: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._heard >= self.settings.read_timeout and self._silent is None:
                self._silent = why
                self._probe_at = now + self.settings.read_timeout

    def _note_answer(self) -> None:
        with self._lock:
            self._heard = time.monotonic()
            self._silent = None

    def _get_once(self, key: str, path: str, headers: dict[str, str], deadline: float) -> memoryview:
        connection = self._idle_connection()
        reused = connection is not None
        try:
            if connection is None:
                connection = self._connect(deadline)
            assert connection.sock is not None
            connection.sock.settimeout(time_left(deadline, self.settings.read_timeout))
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            self._note_answer()
            if response.status == 200:
                body = self._read_body(response, connection.sock, deadline)
                self._release(connection, response)
                return body
            error = response.read()
            self._release(connection, response)
        except Retry:  # the deadline came in the middle of it
            if connection is not None:
                connection.close()
            raise
        except (OSError, http.client.HTTPException) as exc:
            if connection is not None:
                connection.close()
            if reused and not isinstance(exc, TimeoutError):
                return self._get_once(key, path, headers, deadline)  # the server closed an idle connection
            raise Retry(f"connection failed: {exc}") from None
        match = _ERROR_CODE.search(error)
        code = match.group(1).decode(errors="replace") if match else ""
        if response.status == 404:
            raise ObjectNotFound(key)
        if is_transient(response.status, code):
            raise Retry(f"HTTP {response.status} {code}".rstrip())
        raise BackendError(f"GET {key}: HTTP {response.status} {code}".rstrip())

    def _read_body(self, response: http.client.HTTPResponse, sock: socket.socket, deadline: float
                   ) -> memoryview:
        """The body, each socket read bounded by the read timeout and by the deadline."""
        length = response.length
        if length is None:  # chunked transfer: no length to read into
            return memoryview(response.read())
        body = memoryview(np.empty(length, dtype=np.uint8))
        received = 0
        while received < length:
            sock.settimeout(time_left(deadline, self.settings.read_timeout))
            count = response.readinto(body[received:])
            if not count:
                raise http.client.IncompleteRead(bytes(0), length - received)
            received += count
        return body

    def _idle_connection(self) -> http.client.HTTPConnection | None:
        with self._lock:
            return self._idle.pop() if self._idle else None

    def _connect(self, deadline: float) -> http.client.HTTPConnection:
        timeout = time_left(deadline, self.settings.connect_timeout)
        if self._https:
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout, context=self._ssl_context)
        else:
            connection = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        connection.connect()
        assert connection.sock is not None
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
