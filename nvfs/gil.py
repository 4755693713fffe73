"""The GIL's switch interval for processes whose threads mix Python with blocking calls."""

from __future__ import annotations

import sys

SWITCH_INTERVAL = 0.0002  # seconds; CPython's default is 0.005


def hand_over_quickly() -> None:
    """Let a thread that comes back from a blocking call take the GIL within 0.2 ms, not 5.

    A thread that gives up the GIL for a moment (a read of /dev/fuse or of a socket, a zstd
    or numpy call) waits up to the switch interval to get it back from a thread running
    Python. The daemon's FUSE thread and workers do that thousands of times a second: at
    the default 5 ms a worker coding a chunk next to a busy Python thread took 206 ms instead
    of about 7 (0.1 ms: 15 ms), and benchmarks/write.py's nvfs dir save took 4.86 s instead
    of 4.51 (3 runs each). A fetch process's lanes read each GET in many socket reads next to
    lanes decoding; there the shorter interval made no measurable difference to a restore
    (README, session 21), and it keeps their threads behaving as the daemon's do.
    """
    sys.setswitchinterval(SWITCH_INTERVAL)
