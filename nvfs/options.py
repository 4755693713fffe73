"""Mount options (``-o a,b=c``): nvfs's own, FUSE's, and generic ones that are ignored."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from nvfs.backend.deadlines import Deadlines
from nvfs.store.chunk_processes import PUT_TIMEOUT
from nvfs.vfs import VfsConfig


class OptionError(ValueError):
    """An option nvfs does not know, or a value it cannot use."""


# Options mount(8) and fstab pass to every filesystem; they mean nothing to nvfs.
GENERIC_OPTIONS = frozenset({
    "rw", "dev", "nodev", "suid", "nosuid", "exec", "noexec", "atime", "noatime", "relatime",
    "norelatime", "strictatime", "nostrictatime", "diratime", "nodiratime", "lazytime", "nolazytime",
    "_netdev", "auto", "noauto", "nofail", "user", "nouser", "users", "owner", "group", "defaults",
    "async", "sync", "default_permissions",
})
_SIZE = re.compile(r"^(\d+)([kKmMgGtTpP]?)(i?[bB])?$")
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
LOG_LEVELS = ("debug", "info", "warning", "error")
CODECS = ("portable", "ans")
MAX_GPU = 255  # highest CUDA device number accepted
# Options whose value is a size in bytes, with their allowed range.
_SIZE_OPTIONS = {
    "chunk_size": (64 << 10, 64 << 20),
    "cache_size": (0, 1 << 40),
    "max_inflight": (1 << 20, 1 << 40),
    "max_dirty": (1 << 20, 1 << 40),
    "readahead": (0, 1 << 34),
    "max_file_size": (1 << 20, 1 << 50),  # writes and truncates past it get EFBIG
}
# Deadlines of S3 requests (nvfs/backend/deadlines.py explains them and their defaults), in
# seconds, with their allowed range: below a tenth of a second a busy but healthy server fails
# requests; a day is longer than anyone would wait for a read.
_DEADLINE_OPTIONS = {
    "connect_timeout": (0.1, 600.0),
    "read_timeout": (0.1, 3600.0),
    "request_timeout": (1.0, 86400.0),
}


def parse_size(text: str) -> int:
    """``4M``, ``512k``, ``1GiB`` or plain bytes."""
    match = _SIZE.match(text.strip())
    if not match:
        raise OptionError(f"{text!r} is not a size (examples: 4M, 512k, 1G)")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]


@dataclass
class MountOptions:
    """Everything ``-o`` decided."""

    vfs: VfsConfig = field(default_factory=VfsConfig)
    fuse: set[str] = field(default_factory=set)
    engine: str = "auto"
    gpu: int = 0  # CUDA device of the GPU engine
    codec: str = "portable"  # chunk coding: portable (every engine reads it) or ans (GPU-only)
    level: int = 3
    log_file: str | None = None
    log_level: str = "info"
    # S3: endpoint_url, region, profile; connect_timeout, read_timeout, request_timeout (seconds)
    backend: dict[str, str | float] = field(default_factory=dict)
    gc_grace: float | None = None
    stage_dir: str | None = None
    stage_size: int = 16 << 30
    cache_dir: str | None = None
    cache_dir_size: int = 8 << 30
    direct_writes: bool = True  # whole-file write-only handles bypass the page cache (-o cached_writes: not)
    fetch_procs: int = field(default_factory=lambda: default_fetch_procs(os.cpu_count() or 1))
    # Processes that hash, code and write chunks into a directory store (CPU engine), outside
    # the daemon's GIL (nvfs/store/chunk_io.py says why). In a first probe on
    # the 2-core VM one process with four lanes saved 2 GiB in 4.29-4.37 s, two processes of
    # two lanes each in 4.54-4.60 s.
    write_procs: int = 1
    write_timeout: float = PUT_TIMEOUT  # seconds a write process may take on one chunk: then it is hung


def default_fetch_procs(cores: int) -> int:
    """Processes that fetch and decode chunks for reads from S3 (nvfs/store/chunk_processes/).

    Two where there are cores for them. On 16 cores, alternating, a cold 2 GiB ``cat`` from
    SeaweedFS read 0.78 and 0.89 GB/s without them, 1.12 and 1.05 with two (``torch.load``:
    0.80 and 0.86, 0.95 and 0.85); with evicted chunks unmapped off the event loop since,
    two gave 1.24-1.49 GB/s (``torch.load`` 0.99-1.14) in later runs, the daemon and both
    children at 521-646 MiB. On 2 cores two slowed ``cat`` from 0.64-0.65 to 0.51 GB/s:
    there the children and SeaweedFS compete for the same cores.
    """
    return 2 if cores >= 8 else 0


def _bounded(name: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise OptionError(f"{name}={value} is out of range ({low}..{high})")
    return value


def _integer(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise OptionError(f"{name} takes a whole number, not {text!r}") from None


def parse_options(specs: list[str]) -> MountOptions:
    """Parse every ``-o`` argument (each a comma-separated list) into :class:`MountOptions`."""
    options = MountOptions()
    for spec in specs:
        for item in filter(None, (part.strip() for part in spec.split(","))):
            name, has_value, value = item.partition("=")
            _apply(options, name, value if has_value else None)
    _check_deadlines(options.backend)
    return options


def _check_deadlines(backend: dict[str, str | float]) -> None:
    """The deadlines, as given or by default, must let one whole attempt finish in time."""
    given = {name: float(backend[name]) for name in _DEADLINE_OPTIONS if name in backend}
    if not given:
        return
    defaults = Deadlines()
    deadlines = Deadlines(given.get("connect_timeout", defaults.connect),
                          given.get("read_timeout", defaults.read),
                          given.get("request_timeout", defaults.request))
    try:
        deadlines.check()
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def _apply(options: MountOptions, name: str, value: str | None) -> None:
    if name in GENERIC_OPTIONS or name.startswith("x-") or name == "comment":
        return
    if name in ("allow_other", "ro", "async_close", "cached_writes"):
        if value is not None:
            raise OptionError(f"{name} takes no value")
        if name == "async_close":
            options.vfs.async_close = True
        elif name == "cached_writes":
            options.direct_writes = False
        else:
            options.fuse.add(name)
        return
    if value is None:
        raise OptionError(f"unknown option {name!r}" if name not in _VALUED else f"{name} needs a value")
    if name in _SIZE_OPTIONS:
        setattr(options.vfs, name, _bounded(name, _size(name, value), *_SIZE_OPTIONS[name]))
    elif name == "threads":
        options.vfs.threads = _bounded(name, _integer(name, value), 1, 256)
    elif name == "fetch_procs":
        options.fetch_procs = _bounded(name, _integer(name, value), 0, 64)
    elif name == "write_procs":
        options.write_procs = _bounded(name, _integer(name, value), 0, 64)
    elif name == "write_timeout":
        options.write_timeout = _seconds(name, value)
        if not 1 <= options.write_timeout <= 86400:
            raise OptionError(f"write_timeout={value} is out of range (1..86400 seconds)")
    elif name == "level":
        options.level = _bounded(name, _integer(name, value), 1, 19)
    elif name == "engine":
        if value not in ("auto", "cpu", "gpu"):
            raise OptionError(f"engine must be auto, cpu or gpu, not {value!r}")
        options.engine = value
    elif name == "gpu":
        options.gpu = _bounded(name, _integer(name, value), 0, MAX_GPU)
    elif name == "codec":
        if value not in CODECS:
            raise OptionError(f"codec must be {' or '.join(CODECS)}, not {value!r}")
        options.codec = value
    elif name == "log_file":
        options.log_file = value
    elif name in _BACKEND_OPTIONS:
        options.backend[name] = value
    elif name in _DEADLINE_OPTIONS:
        options.backend[name] = _deadline(name, value)
    elif name == "metadata_ttl":
        options.vfs.metadata_ttl = _seconds(name, value)
    elif name == "gc_grace":
        options.gc_grace = _seconds(name, value)
    elif name == "stage_dir":
        options.stage_dir = value
    elif name == "cache_dir":
        options.cache_dir = value
    elif name == "cache_dir_size":
        options.cache_dir_size = _bounded(name, _size(name, value), 64 << 20, 1 << 50)
    elif name == "stage_size":
        options.stage_size = _bounded(name, _size(name, value), 64 << 20, 1 << 50)
    elif name == "log_level":
        if value not in LOG_LEVELS:
            raise OptionError(f"log_level must be one of {', '.join(LOG_LEVELS)}")
        options.log_level = value
    else:
        raise OptionError(f"unknown option {name!r}")


_BACKEND_OPTIONS = frozenset({"endpoint_url", "region", "profile"})
_VALUED = frozenset(_SIZE_OPTIONS) | _BACKEND_OPTIONS | frozenset(_DEADLINE_OPTIONS) | {
    "threads", "fetch_procs", "write_procs", "write_timeout", "level", "engine", "gpu", "codec", "log_file",
    "log_level", "metadata_ttl", "gc_grace", "stage_dir", "stage_size", "cache_dir", "cache_dir_size"}


def _size(name: str, text: str) -> int:
    try:
        return parse_size(text)
    except OptionError as exc:
        raise OptionError(f"{name}: {exc}") from None


def _deadline(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise OptionError(f"{name} takes seconds, not {text!r}") from None
    low, high = _DEADLINE_OPTIONS[name]
    if not low <= value <= high:  # NaN too
        raise OptionError(f"{name}={text} is out of range ({low:g}..{high:g} seconds)")
    return value


def _seconds(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise OptionError(f"{name} takes seconds, not {text!r}") from None
    if not 0 <= value <= 7 * 86400:
        raise OptionError(f"{name}={text} is out of range (0..604800 seconds)")
    return value
