"""What /proc says about a process and its children: memory counters, CPU seconds, liveness.

The tests bound a daemon's memory and CPU with these, and the benchmarks report them; an nvfs
daemon's fetch and write processes are its children, so most readers here also walk those.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (which may itself hold spaces)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def proc_status(pid: int, key: str) -> int | None:
    """A ``kB`` field of /proc/PID/status (VmRSS, VmHWM) in bytes; None once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return None  # a zombie has no Vm* lines


def children_of(pid: int) -> list[int]:
    """Live child processes of ``pid`` (an nvfs daemon's fetch and write processes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat_fields(int(entry.name))[1]) == pid:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone: it may not be our child to reap)."""
    try:
        state = _stat_fields(pid)[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def tree_status(pid: int, key: str) -> int | None:
    """:func:`proc_status` of ``pid`` plus its children's (an nvfs daemon's fetch processes).

    Nothing is counted twice: a child maps the memory of a chunk while it decodes it, and the
    daemon maps it only once the child has let go of it. Summed peaks (VmHWM) may come from
    different moments: an upper bound.
    """
    own = proc_status(pid, key)
    if own is None:
        return None
    return own + sum(proc_status(child, key) or 0 for child in children_of(pid))


def rss_with_write_processes(pid: int) -> int | None:
    """VmRSS of ``pid`` plus its children's, each child's shared memory left out.

    A write process's shared memory is the daemon's chunk buffers, which the daemon wrote
    and its own VmRSS holds already.
    """
    own = proc_status(pid, "VmRSS")
    if own is None:
        return None
    return own + sum(max(0, (proc_status(child, "VmRSS") or 0) - (proc_status(child, "RssShmem") or 0))
                     for child in children_of(pid))


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (NaN if it is gone)."""
    if pid is None:
        return math.nan
    try:
        fields = _stat_fields(pid)
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int | None) -> float:
    """:func:`cpu_seconds` of ``pid`` plus its live children's."""
    if pid is None:
        return math.nan
    return cpu_seconds(pid) + sum(cpu_seconds(child) for child in children_of(pid))
