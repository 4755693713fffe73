"""What the numbers depend on: the machine, what else runs on it, and the code measured."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _first_line(command: list[str]) -> str:
    """The first line a command prints (stdout, else stderr), or why there is none."""
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else f"exit {out.returncode}"


def tool_version(*command: str) -> str:
    """``weed version``, ``juicefs --version``: the first line the tool prints."""
    return _first_line(list(command))


def _git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30)
    return out.stdout.strip() if out.returncode == 0 else ""


def commit() -> str:
    """The short commit measured, ``+dirty`` when nvfs/ has uncommitted changes (measured too)."""
    head = _git("rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    return head + ("+dirty" if _git("status", "--porcelain", "--", "nvfs") else "")


def gpu_name() -> str | None:
    """The first GPU's name from ``nvidia-smi`` (which makes no CUDA context), None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    return _first_line(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])


def machine(work: Path | None = None) -> dict[str, Any]:
    """CPU, cores, memory, GPU, kernel, versions and the commit, as the JSON result records them."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "?")
    mem_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:"))
    info: dict[str, Any] = {
        "cpu": cpu, "cores": len(os.sched_getaffinity(0)), "memory_gib": round(mem_kib / 2**20, 1),
        "gpu": gpu_name(), "kernel": platform.release(), "python": platform.python_version(),
        "commit": commit()}
    torch = sys.modules.get("torch")  # reported where the scenario uses it; never imported for this
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    if work is not None:
        fs = subprocess.run(["df", "--output=fstype,source", str(work)], capture_output=True, text=True)
        info["workdir_fs"] = " ".join(fs.stdout.split()[2:]) if fs.returncode == 0 else "?"
    return info


def machine_line(info: dict[str, Any]) -> str:
    """:func:`machine` in one line for a run's header."""
    parts = [f"nproc {info['cores']} ({info['cpu']}), {info['memory_gib']:.1f} GiB RAM",
             f"kernel {info['kernel']}, python {info['python']}"]
    if info.get("gpu"):
        parts.append(f"GPU {info['gpu']}")
    if "torch" in info:
        parts.append(f"torch {info['torch']}, torch threads {info['torch_threads']}")
    if "workdir_fs" in info:
        parts.append(f"workdir fs {info['workdir_fs']}")
    return ", ".join(parts)


def load_note(mine: int | None = None) -> str:
    """Load average and processes this run did not start that compete for the CPUs.

    ``mine``: one more process of this run's own (a SeaweedFS server it started), left out.
    """
    skip = {os.getpid(), mine}
    others: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid in skip or not argv or not argv[0]:
            continue
        name = os.path.basename(argv[0]).decode(errors="replace")
        if name in ("weed", "juicefs"):
            others[name] = others.get(name, 0) + 1
        elif b"nvfs" in argv[:3] and b"mount" in argv[:4]:
            others["nvfs daemon"] = others.get("nvfs daemon", 0) + 1
        elif b"pytest" in b" ".join(argv[:4]):
            others["pytest"] = others.get("pytest", 0) + 1
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    running = ", ".join(f"{n} {name}" for name, n in sorted(others.items())) or "none"
    return f"loadavg {load}; other processes: {running}"
