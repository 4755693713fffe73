"""How the store reports failures: a store it cannot use, a backend that failed, a chunk it could not get."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

from nvfs.backend import BackendError, ErrnoCarrier, ObjectNotFound
from nvfs.store.chunk import ChunkCorrupt


class StoreError(Exception):
    """The backend does not hold a usable nvfs store."""


class StoreUnavailable(ErrnoCarrier):
    """The backend failed (unreachable, refused, full): the operation did not happen.

    ``errno`` reports it: ENOSPC, EDQUOT, EFBIG or ENAMETOOLONG where the backend's failure
    was one of those, else EIO.
    """


class ChunkUnreadable(StoreUnavailable):
    """The backend failed to return a chunk; its bytes are unknown."""


def reports_backend_failures(method):
    """Turn a backend failure inside a store operation into :class:`StoreUnavailable`."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except ObjectNotFound:
            raise
        except (BackendError, OSError) as exc:
            raise StoreUnavailable(str(exc)) from exc

    return wrapper


@contextlib.contextmanager
def chunk_failures() -> Iterator[None]:
    """Failures to get a chunk object, as the store reports them: a missing object is corrupt."""
    try:
        yield
    except ObjectNotFound:
        raise ChunkCorrupt("chunk object is missing") from None
    except BackendError as exc:
        raise ChunkUnreadable(str(exc)) from exc
