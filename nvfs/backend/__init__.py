"""Backend layer: a flat key space of immutable-by-convention objects.

The store speaks only in keys (``nvfs.json``, ``chunks/ab/<id>``, ``tree/<path>``); a
backend maps them onto a local directory or onto the objects of an S3 bucket.
"""

from nvfs.backend.base import Backend, ListedObject
from nvfs.backend.directory import DirectoryBackend
from nvfs.backend.errors import (
    KEPT_ERRNOS,
    BackendError,
    ErrnoCarrier,
    ObjectNotFound,
    StoreLocked,
    failure_errno,
)
from nvfs.backend.staged import StagedBackend

__all__ = ["KEPT_ERRNOS", "Backend", "BackendError", "DirectoryBackend", "ErrnoCarrier", "ListedObject",
           "ObjectNotFound",            "StagedBackend", "StoreLocked", "failure_errno", "open_backend"]


def open_backend(source: str, options: dict[str, str] | None = None) -> Backend:
    """Open the backend ``source`` names: ``s3://bucket/prefix`` or a directory path.

    ``options`` are the S3 settings (``endpoint_url``, ``region``, ``profile``).
    """
    options = options or {}
    if source.startswith("s3://"):
        from nvfs.backend.s3 import S3Backend  # boto3 is only needed for S3 sources

        return S3Backend(source, **options)
    if options:
        raise BackendError(f"options {', '.join(sorted(options))} apply to s3:// sources only")
    return DirectoryBackend(source)
