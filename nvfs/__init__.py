"""nvfs: a FUSE filesystem for deep-learning checkpoints.

Layers, each knowing only the ones below it:
``cli`` -> ``fuse`` (kernel adapter) -> ``vfs`` (inodes, open files, buffers, read-ahead)
-> ``store`` (manifests, chunk format, dedup, checksums) -> ``codec`` and ``backend``.
"""

__version__ = "0.1.0"
