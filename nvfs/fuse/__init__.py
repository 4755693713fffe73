"""FUSE adapter: translates kernel requests (pyfuse3) into vfs calls; no storage logic here."""

from nvfs.fuse.operations import Operations

__all__ = ["Operations"]
