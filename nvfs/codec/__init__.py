"""Codec layer: reversible transforms and entropy coders, with CPU (and later GPU) engines.

The store hands an engine the uncompressed bytes of one chunk and gets back an
:class:`Encoded` value that says exactly how to undo the work (codec, transform and
transform parameters); the store records those in the chunk header so that any engine
on any machine can decode it.
"""

from nvfs.codec.base import Codec, CodecError, ElementKind, Encoded, Engine, Transform
from nvfs.codec.cpu import CpuEngine
from nvfs.codec.layout import LayoutTracker
from nvfs.codec.planes import Region

__all__ = ["Codec", "CodecError", "CpuEngine", "ElementKind", "Encoded", "Engine", "LayoutTracker", "Region",
           "Transform", "make_engine"]


def make_engine(name: str, level: int, *, gpu: int = 0, codec: str = "zstd") -> Engine:
    """Build the engine a mount asked for (``-o engine=auto|gpu|cpu``, ``gpu=N``, ``codec=zstd|ans``).

    GPU support is not implemented yet: ``gpu`` and ``codec`` are accepted for the coming GPU engine.
    """
    if codec not in ("zstd", "ans"):
        raise CodecError(f"codec {codec!r} is not known (use zstd or ans)")
    if name in ("auto", "cpu") and codec == "zstd":
        return CpuEngine(level=level)
    raise CodecError(f"engine {name!r} with codec {codec!r} is not available in this version (use cpu)")
