"""The daemon gives memory back once a burst of writes is over (nvfs/daemon.py, nvfs/heap.py).

Chunk buffers freed after their upload stay in glibc's heap unless the daemon trims it; an
idle daemon would then hold what its last checkpoint write needed, and a restore on the same
mount would start from there.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.common import proc_status

MIB = 1 << 20
IDLE_BOUND = 72 * MIB  # an idle daemon held 25 MiB before writing, 53 MiB after this test's trim
BURST = 512  # MiB written: ~100 MiB of the heap in use at the end of it, which no trim left there


def _anonymous_memory(pid: int) -> int:
    value = proc_status(pid, "RssAnon")
    assert value is not None, "the daemon is gone"
    return value


def test_the_heap_is_trimmed_after_a_burst_of_writes(mount_factory):
    mount = mount_factory(options=("threads=8",))
    mount.mount()
    pid = mount.daemon_pid()
    rng = np.random.default_rng(0)
    block = (rng.standard_normal(MIB // 4) * 0.02).astype(np.float32)
    with open(mount.path / "ckpt.bin", "wb") as f:
        for index in range(BURST):
            block[:4] = index  # every block distinct: nothing dedups
            f.write(block.tobytes())
    held = _anonymous_memory(pid)
    assert held > IDLE_BOUND, f"writing left only {held / MIB:.0f} MiB: nothing for a trim to show"
    deadline = time.monotonic() + 15
    while _anonymous_memory(pid) > IDLE_BOUND and time.monotonic() < deadline:
        time.sleep(0.1)  # polling /proc: the trim runs a second after the last upload
    after = _anonymous_memory(pid)
    assert after <= IDLE_BOUND, f"the daemon holds {after / MIB:.0f} MiB (at close: {held / MIB:.0f} MiB)"
