"""The daemon gives memory back once a burst of writes is over (nvfs/daemon.py, nvfs/heap.py).

Chunk buffers freed after their upload may stay in glibc's heap unless the daemon trims it; an
idle daemon would then hold what its last checkpoint write needed, and a restore on the same
mount would start from there.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from nvfs.testing.procfs import proc_status

pytestmark = pytest.mark.fuse

MIB = 1 << 20
BURST = 512  # MiB written
# What the idle daemon may hold after the burst beyond what it held before it (25-26 MiB):
# 15-22 MiB more once the heap was trimmed (2-core VM, idle or with both cores kept busy by
# other processes). With the daemon's trim taken out, glibc gave most back by itself in 9 of 10
# runs and kept 43 MiB more in one; judged by what it held at close instead (72 MiB at least),
# this test had failed on a busy machine where only 71 MiB were held.
GROWTH_BOUND = 36 * MIB


def _anonymous_memory(pid: int) -> int:
    value = proc_status(pid, "RssAnon")
    assert value is not None, "the daemon is gone"
    return value


def test_the_heap_is_trimmed_after_a_burst_of_writes(mount_factory):
    mount = mount_factory(options=("threads=8",))
    mount.mount()
    pid = mount.daemon_pid()
    idle = _anonymous_memory(pid)
    rng = np.random.default_rng(0)
    block = (rng.standard_normal(MIB // 4) * 0.02).astype(np.float32)
    with open(mount.path / "ckpt.bin", "wb") as f:
        for index in range(BURST):
            block[:4] = index  # every block distinct: nothing dedups
            f.write(block.tobytes())
    held = _anonymous_memory(pid)
    deadline = time.monotonic() + 15
    while _anonymous_memory(pid) > idle + GROWTH_BOUND and time.monotonic() < deadline:
        time.sleep(0.1)  # polling /proc: the trim runs a second after the last upload
    after = _anonymous_memory(pid)
    assert after <= idle + GROWTH_BOUND, (f"the daemon holds {after / MIB:.0f} MiB, {idle / MIB:.0f} MiB "
                                          f"before writing and {held / MIB:.0f} MiB at close")
