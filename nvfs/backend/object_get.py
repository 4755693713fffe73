"""One GET of a whole object, described so that any process can send it.

A backend that serves chunks over HTTP hands the store an :class:`ObjectGet`
(:meth:`nvfs.backend.base.Backend.chunk_request`); the store sends it from a worker thread
or a fetch process, through an :class:`nvfs.backend.http_get.ObjectGetter` made from its
settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvfs.backend.deadlines import DEFAULT_REQUEST_TIMEOUT, Deadlines


@dataclass(frozen=True)
class GetterSettings:
    """Where and how to GET: everything a fetch process needs to make its own getter."""

    origin: str  # scheme://host[:port]
    connect_timeout: float
    read_timeout: float
    max_attempts: int
    ca_bundle: str | None = None  # None: the system's default CAs (https only)
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT  # the whole GET, retries included

    @property
    def deadlines(self) -> Deadlines:
        return Deadlines(self.connect_timeout, self.read_timeout, self.request_timeout, self.max_attempts)


@dataclass(frozen=True)
class ObjectGet:
    """One GET of a whole object, for any getter made from ``settings``, in any process.

    Whoever sends it asks for :meth:`headers` then: a subclass signs them there, so that the
    process that made the request need not spend its time signing.
    """

    settings: GetterSettings
    key: str  # the object's name, for messages
    path: str

    def headers(self) -> dict[str, str]:
        """The request's headers, signed if it must be; none for an anonymous GET."""
        return {}
