"""Cold reads of the S3 scenario's checkpoint, through nvfs and plainly, and what they cost in CPU.

Each read is a *trial*: (seconds, what else was measured meanwhile). A row shows the median
trial of several and lists them all.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from benchmarks.harness.files import drop_caches, timed_cat
from benchmarks.harness.mounts import NvfsMount
from benchmarks.harness.report import median
from benchmarks.harness.units import MIB, human
from nvfs.testing.procfs import cpu_seconds, tree_cpu_seconds, tree_status
from nvfs.testing.seaweed import REGION, SeaweedServer

BUCKET_NVFS = "nvfs"
BUCKET_PLAIN = "plain"


def s3_mount(server: SeaweedServer, prefix: str, work: Path, name: str, options: str) -> NvfsMount:
    """An nvfs mount (not mounted yet) of ``s3://nvfs/PREFIX`` on the local server, at work/mnt-NAME."""
    return NvfsMount(f"s3://{BUCKET_NVFS}/{prefix}", work / f"mnt-{name}", work / f"nvfs-{name}.log", options,
                     env=server.environ(), endpoint_url=server.endpoint_url)


class CpuMeter:
    """CPU seconds the daemon (with its fetch processes) and SeaweedFS spend from now on."""

    def __init__(self, pid: int, server: SeaweedServer) -> None:
        self.pid, self.server = pid, server
        self.daemon, self.weed = tree_cpu_seconds(pid), cpu_seconds(server.pid)

    def note(self) -> str:
        return (f"daemon CPU {tree_cpu_seconds(self.pid) - self.daemon:.1f} s, weed CPU "
                f"{cpu_seconds(self.server.pid) - self.weed:.1f} s")


Trial = tuple[float, str]  # seconds, and what else was measured meanwhile


def cold_cat(mount: NvfsMount, path: Path, server: SeaweedServer, extra: str = "") -> Trial:
    """``cat`` on a fresh mount with ``extra`` options, page cache dropped: (seconds, CPU and memory).

    It stays mounted.
    """
    pid = mount.mount(extra)
    drop_caches()
    meter = CpuMeter(pid, server)
    seconds = timed_cat(path)
    return seconds, f"{meter.note()}, daemon VmHWM {human(tree_status(pid, 'VmHWM'))}"


def cold_get_object(client: Any, server: SeaweedServer, size: int) -> Trial:
    """The plain object streamed by one ``get_object``, page cache dropped: (seconds, weed CPU)."""
    drop_caches()
    weed0 = cpu_seconds(server.pid)
    start = time.perf_counter()
    body = client.get_object(Bucket=BUCKET_PLAIN, Key="ckpt.pt")["Body"]
    got = sum(len(block) for block in body.iter_chunks(MIB))
    seconds = time.perf_counter() - start
    if got != size:
        raise AssertionError(f"get_object returned {got} bytes, expected {size}")
    return seconds, f"weed CPU {cpu_seconds(server.pid) - weed0:.1f} s"


def median_trial(trials: list[Trial]) -> Trial:
    """The trial of median time (the lower middle one of an even count) and its detail."""
    return median(trials)


def trials_note(trials: list[Trial]) -> str:
    """How a median row was made, with every trial's seconds in the order they ran."""
    if len(trials) == 1:
        return "1 trial"
    return f"median of {len(trials)} trials ({', '.join(f'{seconds:.2f}' for seconds, _ in trials)} s)"



def plain_client(server: SeaweedServer) -> Any:
    """A boto3 S3 client with boto3's defaults (10 pooled connections, default timeouts)."""
    env = server.environ()
    return boto3.client("s3", endpoint_url=server.endpoint_url, region_name=REGION,
                        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                        config=Config(s3={"addressing_style": "path"}))
