"""Checkpoint file formats: what the bytes of a file hold, learned from the file as it is written.

Checkpoint formats say where each tensor lies and of what dtype: a safetensors header
(:mod:`nvfs.formats.safetensors`), the ``data.pkl`` of a ``torch.save`` zip file
(:mod:`nvfs.formats.torch_zip`). The :class:`LayoutTracker` (:mod:`nvfs.formats.tracker`)
feeds a file's chunks to the parser its first bytes call for and tells the store which
regions of each chunk hold bf16, fp16, fp32 or fp64 values, so that the codec splits those
into byte planes. This package knows file formats, not coding: it depends on
:mod:`nvfs.codec.base` alone.
"""

from nvfs.formats.tracker import LayoutTracker

__all__ = ["LayoutTracker"]
