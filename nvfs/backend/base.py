"""The interface every backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from nvfs.backend.object_get import ObjectGet

Buffer = bytes | bytearray | memoryview


class ListedObject(NamedTuple):
    """One object of a recursive listing.

    ``version`` changes whenever the object is replaced (an ETag, or inode, size and mtime),
    as in :meth:`Backend.list_dir`; an empty one means "unknown": read the object again.
    """

    key: str
    modified: float  # epoch seconds
    version: str


class Backend(ABC):
    """A key-value object store. Keys are ``/``-separated strings without a leading ``/``.

    ``put`` is atomic: a reader sees the old object or the new one, never a mix. With
    ``durable=False`` the object may be lost in a crash until :meth:`sync` returns; the
    store writes chunks that way and syncs once before it writes the manifest that
    names them.

    A ``shared`` backend may be used by several mounts at once (an S3 bucket); a private
    one is locked by one daemon (a local directory).
    """

    shared = False
    prefix = ""  # what the backend puts before every key (an S3 store's prefix in its bucket)

    @abstractmethod
    def describe(self) -> str:
        """A short human-readable name (for logs and ``df``)."""

    @abstractmethod
    def get(self, key: str, *, content_addressed: bool = False) -> bytes | memoryview:
        """Return the whole object; raise :class:`ObjectNotFound` if it is absent.

        ``content_addressed``: the key names a checksum of the content that the caller
        verifies (chunks). Such an object never changes, so it may be served from a local
        copy, and transport checksums add nothing to it.
        """

    def chunk_request(self, key: str, *, wait: bool = True) -> ObjectGet | None:
        """A GET of the content-addressed object ``key`` that another process may sign and send.

        ``None`` where the object is not fetched over HTTP by a lean reader (a directory,
        a staged copy, an S3 store whose chunks go through boto3), and, with ``wait=False``,
        where making the request would block (credentials to refresh).
        """
        return None

    def files_root(self) -> str | None:
        """The directory holding each object as the file named by its key, if this backend is one.

        Another process may then store chunk objects there itself, exactly as
        :meth:`put_parts` with ``durable=False`` would (``None`` elsewhere).
        """
        return None

    @abstractmethod
    def put(self, key: str, data: bytes, *, durable: bool) -> None:
        """Create or atomically replace an object."""

    def put_parts(self, key: str, parts: Sequence[Buffer], *, durable: bool) -> None:
        """:meth:`put` of the object made of ``parts`` back to back.

        A chunk comes as its header and payload: a backend that can write them as they are
        saves joining several MiB per chunk.
        """
        self.put(key, b"".join(parts), durable=durable)

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; a missing object is not an error."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object exists under the key."""

    @abstractmethod
    def list_dir(self, prefix: str) -> tuple[dict[str, str], list[str]]:
        """Objects and sub-prefixes directly under ``prefix`` (which ends in ``/``), as names.

        Each object comes with a version token that changes whenever the object is replaced
        (an ETag, or inode, size and mtime), so callers can skip re-reading what they know.
        """

    @abstractmethod
    def iter_objects(self, prefix: str) -> Iterator[ListedObject]:
        """Every object under ``prefix``, recursively, with its modification time and version."""

    def has_objects(self, prefix: str) -> bool:
        """Whether any object lives under ``prefix`` (listings may show prefixes that are gone)."""
        return next(iter(self.iter_objects(prefix)), None) is not None

    def iter_keys(self, prefix: str) -> Iterator[str]:
        """Every key under ``prefix``, recursively."""
        for listed in self.iter_objects(prefix):
            yield listed.key

    @abstractmethod
    def rename(self, src: str, dst: str) -> None:
        """Move one object, replacing ``dst``."""

    @abstractmethod
    def rename_prefix(self, src: str, dst: str) -> None:
        """Move every object under prefix ``src`` to prefix ``dst`` (which holds no objects)."""

    @abstractmethod
    def sync(self) -> None:
        """Make every earlier ``put`` durable."""

    @abstractmethod
    def is_empty(self) -> bool:
        """Whether the backend holds no objects at all (a fresh store may be created)."""

    @abstractmethod
    def lock(self) -> None:
        """Take the store for this process; raise :class:`StoreLocked` if another holds it."""

    @abstractmethod
    def capacity(self) -> tuple[int, int] | None:
        """``(total_bytes, free_bytes)`` of the underlying storage, or ``None`` if unbounded."""

    def start_background(self) -> None:  # noqa: B027 - optional hook
        """Start background work; called in the daemon process (threads do not survive fork)."""

    def discard_incomplete(self) -> None:  # noqa: B027 - optional hook
        """Remove leftovers of writes a crash interrupted; called once the store is validated."""

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Release the lock and any resources."""
