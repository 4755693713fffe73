"""Codec layer: reversible transforms and entropy coders, with a CPU and a GPU (nvCOMP) engine.

The store hands an engine the uncompressed bytes of one chunk and gets back an
:class:`Encoded` value that says exactly how to undo the work (codec, transform and
transform parameters); the store records those in the chunk header so that any engine
on any machine can decode it.
"""

import importlib.util
import logging

from nvfs.codec.base import Codec, CodecError, ElementKind, Encoded, Engine, Region, Transform
from nvfs.codec.cpu import CpuEngine

log = logging.getLogger(__name__)

__all__ = ["Codec", "CodecError", "CpuEngine", "ElementKind", "Encoded", "Engine", "Region",
           "Transform", "cpu_decodes", "make_engine"]


def make_engine(name: str, level: int, *, gpu: int = 0, codec: str = "portable") -> Engine:
    """Build the engine a mount asked for (``-o engine=auto|gpu|cpu``, ``gpu=N``, ``codec=portable|ans``).

    ``portable`` chunks are read by every engine; ``ans`` chunks (GPU-only, faster) by the GPU engine only.

    ``auto`` takes the GPU engine where CUDA, CuPy and nvCOMP are usable, else the CPU engine
    (and logs why); ``gpu`` insists and raises :class:`CodecError` saying what is missing.
    """
    if name not in ("auto", "gpu", "cpu"):
        raise CodecError(f"engine {name!r} is not known (use auto, gpu or cpu)")
    if codec not in ("portable", "ans"):
        raise CodecError(f"codec {codec!r} is not known (use portable or ans)")
    if name == "cpu":
        if codec == "ans":
            raise CodecError("codec=ans needs the GPU engine: ANS has no CPU coder (use codec=portable)")
        return CpuEngine(level=level)
    try:
        _check_gpu_packages()
        from nvfs.codec.gpu import GpuEngine

        return GpuEngine(level=level, device=gpu, codec=codec)
    except (ImportError, CodecError) as exc:
        if name == "gpu" or codec == "ans":
            raise CodecError(f"engine=gpu{' (needed by codec=ans)' if codec == 'ans' else ''} is not "
                             f"usable: {exc}") from exc
        log.info("engine=auto: using the CPU engine (%s)", exc)
        return CpuEngine(level=level)


def cpu_decodes(encoding: str) -> bool:
    """Whether the CPU engine decodes chunks of ``encoding`` (an :attr:`Encoded.name`): all but ANS planes."""
    return Codec.ANS.name.lower() not in encoding.split("+")


def _check_gpu_packages() -> None:
    """Raise ImportError naming what the GPU engine lacks, before importing any of it.

    Importing CuPy loads CUDA's libraries into the process for good: on a machine with CuPy but
    no nvCOMP, a daemon that then fell back to the CPU engine would carry them, several times its
    own idle memory, for nothing.
    """
    missing = [name for name in ("cupy", "nvidia.nvcomp", "nvidia.libnvcomp") if not _installed(name)]
    if missing:
        raise ImportError(f"the GPU engine needs cupy and nvidia-nvcomp (pip install nvfs[cu13]); missing: "
                          f"{', '.join(missing)}")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False
