"""Byte units and their human form, as every table prints them."""

from __future__ import annotations

MIB = 1 << 20
GIB = 1 << 30


def human(size: float) -> str:
    """``1.50 GiB``: a byte count in the largest binary unit it reaches."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(size) >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size:.0f} B"
