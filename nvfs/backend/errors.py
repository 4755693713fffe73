"""Backend failures, and the errno that reports each one to an application.

The lowest module of the backend layer: every backend, the retry policy
(:mod:`nvfs.backend.deadlines`) and the transports raise these.
"""

from __future__ import annotations

import errno

# Causes a caller can act on, kept as the errno of a failure; any other is EIO.
KEPT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.ENAMETOOLONG})


def failure_errno(exc: BaseException | None) -> int:
    """The errno that reports ``exc`` to an application: its cause's where that is kept, else EIO.

    Looks through the chain of causes, and at an :class:`OSError` given as an argument (a
    write process reports its own ``OSError`` that way, the only form that crosses to the
    daemon).
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        candidates = [exc, *(arg for arg in exc.args if isinstance(arg, OSError))]
        for candidate in candidates:
            if isinstance(candidate, OSError) and candidate.errno in KEPT_ERRNOS:
                return candidate.errno
        explicit = getattr(exc, "_errno", None)
        if explicit is not None:
            return explicit
        exc = exc.__cause__ or exc.__context__
    return errno.EIO


class ErrnoCarrier(Exception):
    """A failure that says which errno reports it: ``errno`` (see :func:`failure_errno`)."""

    def __init__(self, *args: object, errno: int | None = None) -> None:
        super().__init__(*args)
        self._errno = errno

    @property
    def errno(self) -> int:
        return failure_errno(self)


class BackendError(ErrnoCarrier):
    """The backend cannot do what was asked (unreachable, refused, misconfigured, full)."""


class ObjectNotFound(BackendError):
    """No object exists under the key."""


class StoreLocked(BackendError):
    """Another nvfs daemon already holds the store."""
