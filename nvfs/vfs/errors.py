"""The error a vfs operation fails with, and which errno a failure of the store becomes."""

from __future__ import annotations

import errno
import os

# Failures the caller can act on (free space, raise a quota, write a smaller file): passed on
# as they are. Any other failure of the store is EIO.
_CALLER_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class VfsError(Exception):
    """A failed filesystem operation, carrying the errno the caller should see."""

    def __init__(self, err: int, message: str = "") -> None:
        super().__init__(message or os.strerror(err))
        self.errno = err


def store_errno(exc: BaseException) -> int:
    """The errno a failed store operation reports: ENOSPC, EDQUOT or EFBIG as the backend said, else EIO.

    The backend's errno may sit on a wrapping exception (``StoreUnavailable``) or on the
    ``OSError`` it wraps, so the chain of causes is searched.
    """
    seen: BaseException | None = exc
    while seen is not None:
        err = getattr(seen, "errno", None)
        if err in _CALLER_ERRNOS:
            return err
        seen = seen.__cause__
    return errno.EIO
