"""The ``user.nvfs.*`` extended attributes: how a file is stored (sizes, ratio, codec, chunks)."""

from __future__ import annotations

from nvfs.vfs.node import Node

XATTR_PREFIX = "user.nvfs."


def storage_xattrs(node: Node, engine: str, chunk_size: int) -> dict[str, bytes]:
    """``user.nvfs.*`` attributes: stored size, ratio and codec of a file.

    They describe the contents this mount shows, as far as they are stored: right after
    close(2), before the commit that follows it, they are already those of the new version.
    ``engine`` names the engine this mount codes new chunks with, ``chunk_size`` the chunk
    size of a file with no manifest.
    """
    if node.kind != "file":
        return {}
    logical, stored = node.size(), node.stored_size()
    manifest = node.manifest
    if node.content is not None:
        manifest = node.to_manifest()
        manifest.engine = engine
    pending = node.content is not None and node.content.dirty
    values = {
        "logical_size": str(logical),
        "stored_size": str(stored),
        "ratio": f"{logical / stored:.4f}" if stored else "inf" if logical else "1.0000",
        "codec": manifest.codecs() if manifest else "none",
        "engine": (manifest.engine or "cpu") if manifest else "none",
        "chunks": str(len(manifest.chunks)) if manifest else "0",
        "chunk_size": str(manifest.chunk_size if manifest else chunk_size),
        "committed": "no" if pending or node.manifest is None else "yes",
    }
    return {XATTR_PREFIX + key: value.encode() for key, value in values.items()}
