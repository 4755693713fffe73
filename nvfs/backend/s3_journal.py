"""Intent records that make a directory rename on S3 whole after a crash.

S3 has no rename: a directory's objects are copied to the new prefix, then deleted under the
old one, so a move killed half-way leaves the directory split between the two names.
So before it moves anything, :meth:`nvfs.backend.s3.S3Backend.rename_prefix` writes an
intent, the object ``journal/rename-<32 hex digits>`` holding ``{"op": "rename_prefix",
"src": "tree/.../", "dst": "tree/.../", "created": "<UTC time>"}``, and deletes it once the
move is over; every mount finishes the moves whose intents it finds
(:meth:`~nvfs.backend.s3.S3Backend.discard_incomplete`).

An intent is read from a bucket that others may write, so it is checked before it is
obeyed: both prefixes under ``tree/``, made of plain names, neither inside the other.
"""

from __future__ import annotations

import json
import time
import uuid

JOURNAL_PREFIX = "journal/"
RENAME_INTENT = JOURNAL_PREFIX + "rename-"
INTENT_LIMIT = 64 << 10  # bytes read of an intent; one holds two keys of at most 1 KiB each
_TREE = "tree/"
_KEY_LIMIT = 1024  # bytes: S3's limit on a key's length
_OPERATION = "rename_prefix"


class BadIntent(ValueError):
    """A journal object that is not an intent nvfs wrote: it is left alone."""


def new_intent_key() -> str:
    return RENAME_INTENT + uuid.uuid4().hex


def rename_intent(src: str, dst: str) -> bytes:
    """The intent to move every object under prefix ``src`` to prefix ``dst``."""
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return json.dumps({"op": _OPERATION, "src": src, "dst": dst, "created": created}).encode()


def parse_intent(data: bytes | memoryview) -> tuple[str, str]:
    """``(src, dst)`` of an intent; raises :class:`BadIntent` on anything else."""
    if len(data) >= INTENT_LIMIT:
        raise BadIntent(f"larger than {INTENT_LIMIT} bytes")
    try:
        record = json.loads(bytes(data))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadIntent(f"not JSON: {exc}") from None
    if not isinstance(record, dict) or record.get("op") != _OPERATION:
        raise BadIntent(f"not a {_OPERATION} record")
    src, dst = record.get("src"), record.get("dst")
    for name, prefix in (("src", src), ("dst", dst)):
        _check_prefix(name, prefix)
    assert isinstance(src, str) and isinstance(dst, str)
    if src.startswith(dst) or dst.startswith(src):
        raise BadIntent(f"{src!r} and {dst!r}: one is inside the other")
    return src, dst


def _check_prefix(name: str, prefix: object) -> None:
    """A directory's prefix in the tree: ``tree/`` and one or more plain names, each with ``/``."""
    if not isinstance(prefix, str):
        raise BadIntent(f"{name} is not a string")
    if len(prefix.encode()) > _KEY_LIMIT or not prefix.startswith(_TREE) or not prefix.endswith("/"):
        raise BadIntent(f"{name} {prefix!r} is not a directory under {_TREE}")
    names = prefix[len(_TREE):-1].split("/")
    if any(part in ("", ".", "..") for part in names) or any(ord(c) < 32 for c in prefix):
        raise BadIntent(f"{name} {prefix!r} has an empty, '.' or '..' name or a control character")
