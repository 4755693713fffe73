"""Backend layer: a flat key space of immutable-by-convention objects.

The store speaks only in keys (``nvfs.json``, ``chunks/ab/cd/<id>``, ``tree/<path>``); a
backend maps them onto a local directory today and onto S3 objects later.
"""

from nvfs.backend.base import Backend, BackendError, ObjectNotFound, StoreLocked
from nvfs.backend.directory import DirectoryBackend

__all__ = ["Backend", "BackendError", "DirectoryBackend", "ObjectNotFound", "StoreLocked", "open_backend"]


def open_backend(source: str) -> Backend:
    """Open the backend that ``source`` names (a directory path; ``s3://`` comes later)."""
    if source.startswith("s3://"):
        raise BackendError("s3:// sources are not supported yet: use a backing directory")
    return DirectoryBackend(source)
