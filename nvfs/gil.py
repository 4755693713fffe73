"""The GIL's switch interval for processes whose threads mix Python with blocking calls."""

from __future__ import annotations

import sys

SWITCH_INTERVAL = 0.0002  # seconds; CPython's default is 0.005


def hand_over_quickly() -> None:
    """Let a thread that comes back from a blocking call take the GIL within 0.2 ms, not 5.

    A thread that gives up the GIL for a moment (a read of /dev/fuse or of a socket, a zstd
    or numpy call) waits up to the switch interval to get it back from a thread running
    Python. The daemon's FUSE thread and workers do that thousands of times a second, so at
    the default a chunk's coding, a few milliseconds of C, can stretch to hundreds while the
    FUSE thread runs Python between requests. Fetch processes use the same interval so that
    their lanes, which read each GET in many socket reads, behave as the daemon's threads do.
    """
    sys.setswitchinterval(SWITCH_INTERVAL)
