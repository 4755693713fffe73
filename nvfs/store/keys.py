"""The store's keys (docs/FORMAT.md): chunk objects under ``chunks/``, and paths as keys under
``tree/`` ("Names in tree/"), and back.

Keys come back from listings of the store, which anyone who can write to it can fill:
a component that does not decode to one file name is refused here, so that no entry named
``/``, ``..`` or the empty name ever reaches a directory listing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

log = logging.getLogger(__name__)

TREE_PREFIX = "tree/"
DIR_MARKER = "#dir"
CHUNK_PREFIX = "chunks/"

Path = Sequence[str]

_BYTES_NAME = "#x"  # a name that is not UTF-8, as hex of its bytes (object keys must be UTF-8)
_NAME_MAX = 255  # bytes in one path component (Linux NAME_MAX): longer names cannot be listed


def encode_name(name: str) -> str:
    """Key component for a file name (a str with surrogate escapes for non-UTF-8 bytes).

    Names starting with ``#`` get one more ``#``, keeping single-``#`` components for nvfs.
    """
    try:
        name.encode()
    except UnicodeEncodeError:
        return _BYTES_NAME + name.encode(errors="surrogateescape").hex()
    return "#" + name if name.startswith("#") else name


class BadName(ValueError):
    """A key component that does not decode to one file name."""


def decode_name(component: str) -> str | None:
    """File name for a key component, or ``None`` for reserved components such as ``#dir``.

    Raises :class:`BadName` for a component that decodes to no single path component (empty,
    ``.``, ``..``, holding ``/`` or NUL, or longer than NAME_MAX): keys come from the store,
    which anyone who can write to it may fill with such names.
    """
    if component.startswith("##"):
        name = component[1:]
    elif component.startswith(_BYTES_NAME):
        try:
            name = bytes.fromhex(component[len(_BYTES_NAME):]).decode(errors="surrogateescape")
        except ValueError:
            raise BadName(f"{component!r:.300} is not hex after {_BYTES_NAME}") from None
    elif component.startswith("#"):
        return None
    else:
        name = component
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise BadName(f"{component!r:.300} decodes to {name!r:.300}, which is not a file name")
    if len(name.encode(errors="surrogateescape")) > _NAME_MAX:
        raise BadName(f"{component!r:.300} decodes to a name longer than {_NAME_MAX} bytes")
    return name


def listed_name(prefix: str, component: str) -> str | None:
    """The name of a listed component; ``None`` (logged, if it is bad) where it is not an entry."""
    try:
        return decode_name(component)
    except BadName as exc:
        log.error("skipping %s: %s", prefix + component, exc)
        return None


def entry_key(path: Path) -> str:
    return TREE_PREFIX + "/".join(encode_name(name) for name in path)


def dir_prefix(path: Path) -> str:
    return entry_key(path) + "/" if path else TREE_PREFIX


def chunk_key(store_version: int, cid: str) -> str:
    """The key of chunk ``cid`` in a store of format ``store_version``.

    Stores of format 3 keep chunks in 256 directories: on a directory backend the
    65536 of the earlier two-level layout cost a new directory for most chunks of a new
    store, and each new directory, like each new file, an inode that ext4 searches for
    (saving 2 GiB into a new store, seven alternating pairs: 3.4-3.8 s instead of 3.4-4.3 s).
    """
    if store_version >= 3:
        return f"{CHUNK_PREFIX}{cid[:2]}/{cid}"
    return f"{CHUNK_PREFIX}{cid[:2]}/{cid[2:4]}/{cid}"


def key_bytes(backend_prefix: str, key: str) -> int:
    """Length of ``key`` as a backend with ``backend_prefix`` stores it (S3 allows 1024 bytes)."""
    return len((backend_prefix + key).encode())
