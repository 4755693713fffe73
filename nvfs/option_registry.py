"""Every ``-o`` option nvfs knows, declared once: name, type, range or choices, default, help.

Parsing and validation (nvfs/options.py), ``nvfs mount --help`` and docs/CONFIGURATION.md
(nvfs/option_docs.py) are all generated from :data:`OPTIONS`, so adding or changing an option
is one entry here. Defaults that a lower layer needs for itself (the vfs's tunables, the S3
deadlines, the write processes' timeout) stay in that layer and are read from it here.
"""

from __future__ import annotations

import difflib
import enum
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import urlsplit

from nvfs.backend.deadlines import DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT, DEFAULT_REQUEST_TIMEOUT
from nvfs.store.chunk_processes import PUT_TIMEOUT
from nvfs.store.garbage import SHARED_GC_GRACE
from nvfs.vfs import VfsConfig

_Number = TypeVar("_Number", int, float)


class OptionError(ValueError):
    """An option nvfs does not know, or a value it cannot use."""


class Kind(enum.Enum):
    """What an option's value is; each kind has one parser and one way to be shown."""

    FLAG = "flag"  # no value: given means on
    INT = "int"
    SIZE = "size"  # bytes, with an optional binary unit: 4M, 512k, 1GiB
    SECONDS = "seconds"  # a decimal number of seconds
    CHOICE = "choice"
    PATH = "path"
    URL = "url"
    STRING = "string"


# Where an option has an effect (shown in the docs; an S3 option on a directory store is refused
# by the backend, the others are accepted and have no effect there).
EVERYWHERE = "all"
S3_ONLY = "S3"
DIRECTORY_ONLY = "directory"
GPU_ONLY = "GPU"

# Options mount(8) and fstab pass to every filesystem; they mean nothing to nvfs.
GENERIC_OPTIONS = frozenset({
    "rw", "dev", "nodev", "suid", "nosuid", "exec", "noexec", "atime", "noatime", "relatime",
    "norelatime", "strictatime", "nostrictatime", "diratime", "nodiratime", "lazytime", "nolazytime",
    "_netdev", "auto", "noauto", "nofail", "user", "nouser", "users", "owner", "group", "defaults",
    "async", "sync", "default_permissions",
})
IGNORED_PREFIX = "x-"  # options for other tools (systemd, file managers) in an fstab line
IGNORED_COMMENT = "comment"  # fstab's comment=..., also meant for other tools

_SIZE = re.compile(r"^(\d+)([kKmMgGtTpP]?)(i?[bB])?$")
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
_SHOWN_UNITS = (("P", 1 << 50), ("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("k", 1 << 10))
WEEK = 7 * 86400.0  # the longest metadata_ttl or gc_grace accepted, in seconds
# Seconds until a file another mount committed is listed here, on a store other mounts share.
SHARED_METADATA_TTL = 5.0
# Fetch processes run where the host has cores to spare for them: on fewer, they compete with
# the daemon and the object server (docs/decisions/fetch-processes.md).
FETCH_PROCS_MIN_CORES = 8
FETCH_PROCS_ON_MANY_CORES = 2


def parse_size(text: str) -> int:
    """``4M``, ``512k``, ``1GiB`` or plain bytes."""
    match = _SIZE.match(text.strip())
    if not match:
        raise OptionError(f"{text!r} is not a size (examples: 4M, 512k, 1G)")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]


def format_size(size: int) -> str:
    """The shortest way to write ``size`` that :func:`parse_size` reads back exactly."""
    for suffix, unit in _SHOWN_UNITS:
        if size >= unit and size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def default_fetch_procs(cores: int) -> int:
    """How many processes fetch and decode chunks for reads from S3 on a host with ``cores``."""
    return FETCH_PROCS_ON_MANY_CORES if cores >= FETCH_PROCS_MIN_CORES else 0


def _fetch_procs_for_this_host() -> int:
    return default_fetch_procs(os.cpu_count() or 1)


@dataclass(frozen=True)
class Option:
    """One ``-o`` option.

    ``dest`` says where its value goes in :class:`nvfs.options.MountOptions`: ``vfs.NAME`` (the
    vfs's tunables), ``backend.NAME`` (S3 settings, kept only where given), ``fuse.NAME`` (a
    FUSE option passed to the kernel), or a field of its own. ``default`` is the value (or a
    function of the machine giving it) where the option is not given; None means off, or that
    the store decides, which ``shown_default`` then says in words. ``help`` is one line; ``see``
    names a document under docs/ that explains the option: (link text, path).
    """

    name: str
    kind: Kind
    dest: str
    default: object | Callable[[], object] = None
    help: str = field(default="", kw_only=True)
    shown_default: str | None = field(default=None, kw_only=True)
    bounds: tuple[float, float] | None = field(default=None, kw_only=True)  # inclusive
    choices: tuple[str, ...] = field(default=(), kw_only=True)
    applies: str = field(default=EVERYWHERE, kw_only=True)
    metavar: str | None = field(default=None, kw_only=True)
    see: tuple[str, str] | None = field(default=None, kw_only=True)

    def initial(self) -> object:
        """The value a mount runs with where the option is not given."""
        if self.kind is Kind.FLAG:
            return False
        return self.default() if callable(self.default) else self.default

    def parse(self, text: str | None) -> object:
        """The value of ``NAME=text`` (``text`` None: the option was given without ``=``)."""
        if self.kind is Kind.FLAG:
            if text is not None:
                raise OptionError(f"{self.name} takes no value")
            return True
        if text is None:
            raise OptionError(f"{self.name} needs a value")
        return _PARSERS[self.kind](self, text)

    def usage(self) -> str:
        """``name`` or ``name=METAVAR``, as the docs list it."""
        if self.kind is Kind.FLAG:
            return self.name
        if self.kind is Kind.CHOICE:
            return f"{self.name}={'|'.join(self.choices)}"
        return f"{self.name}={self.metavar or _METAVARS[self.kind]}"

    def default_text(self) -> str:
        """The default as a user would write it, or in words."""
        if self.shown_default is not None:
            return self.shown_default
        value = self.initial()
        if value is None or value is False:
            return "off"
        if self.kind is Kind.SIZE:
            return format_size(int(value))
        if self.kind is Kind.SECONDS:
            return f"{value:g}"
        return str(value)

    def accepted_text(self) -> str:
        """The values accepted, in a few words (empty where any text is)."""
        if self.kind is Kind.CHOICE:
            return ", ".join(self.choices)
        if self.bounds is None:
            return {Kind.URL: "http(s) URL"}.get(self.kind, "")
        low, high = self.bounds
        if self.kind is Kind.SIZE:
            return f"{format_size(int(low))}..{format_size(int(high))}"
        if self.kind is Kind.SECONDS:
            return f"{low:g}..{high:g} s"
        return f"{int(low)}..{int(high)}"


def _number(option: Option, text: str, convert: Callable[[str], _Number], wanted: str) -> _Number:
    """``text`` converted and within the option's bounds; ``wanted`` names the kind of value."""
    try:
        value = convert(text)
    except OptionError as exc:  # the converter's own words say what is wrong with the text
        raise OptionError(f"{option.name}: {exc}") from None
    except ValueError:
        raise OptionError(f"{option.name} takes {wanted}, not {text!r}") from None
    return _in_bounds(option, value, value if option.kind is not Kind.SECONDS else text)


def _parse_int(option: Option, text: str) -> int:
    return _number(option, text, int, "a whole number")


def _parse_size(option: Option, text: str) -> int:
    return _number(option, text, parse_size, "a size")


def _parse_seconds(option: Option, text: str) -> float:
    return _number(option, text, float, "seconds")


def _in_bounds(option: Option, value: _Number, shown: object) -> _Number:
    """``value`` if it is within the option's bounds (NaN is not), else an error showing ``shown``."""
    if option.bounds is None:
        return value
    low, high = option.bounds
    if low <= value <= high:
        return value
    if option.kind is Kind.SECONDS:
        raise OptionError(f"{option.name}={shown} is out of range ({low:g}..{high:g} seconds)")
    raise OptionError(f"{option.name}={shown} is out of range ({int(low)}..{int(high)})")


def _parse_choice(option: Option, text: str) -> str:
    if text not in option.choices:
        *first, last = option.choices
        raise OptionError(f"{option.name} must be {', '.join(first)} or {last}, not {text!r}")
    return text


def _parse_url(option: Option, text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise OptionError(f"{option.name} must be an http:// or https:// URL, not {text!r}")
    return text


def _parse_text(option: Option, text: str) -> str:
    if not text:
        raise OptionError(f"{option.name} needs a value")
    return text


_PARSERS: dict[Kind, Callable[[Option, str], object]] = {
    Kind.INT: _parse_int, Kind.SIZE: _parse_size, Kind.SECONDS: _parse_seconds, Kind.CHOICE: _parse_choice,
    Kind.URL: _parse_url, Kind.PATH: _parse_text, Kind.STRING: _parse_text,
}
_METAVARS = {Kind.INT: "N", Kind.SIZE: "SIZE", Kind.SECONDS: "SECONDS", Kind.PATH: "PATH", Kind.URL: "URL",
             Kind.STRING: "NAME"}


# Bounds of the S3 deadlines: below a tenth of a second a busy but healthy server fails requests;
# a day is longer than anyone would wait for a read.
GROUPS: tuple[tuple[str, tuple[Option, ...]], ...] = (
    ("Mount behaviour", (
        Option("allow_other", Kind.FLAG, "fuse.allow_other",
               help="let other users (and agents running as them) use a root mount; permissions are always "
                    "checked by the kernel (default_permissions)"),
        Option("ro", Kind.FLAG, "fuse.ro", help="read-only mount"),
        Option("async_close", Kind.FLAG, "vfs.async_close",
               help="close(2) does not wait for the written data to be stored (it reports only failures "
                    "already known); fsync and unmount still wait for the commit"),
        Option("cached_writes", Kind.FLAG, "cached_writes",
               help="files opened write-only to be created or truncated also go through the page cache; "
                    "for programs that write a few KiB per call",
               see=("why not by default", "decisions/direct-io-writes.md")),
        Option("metadata_ttl", Kind.SECONDS, "vfs.metadata_ttl", VfsConfig.metadata_ttl, bounds=(0, WEEK),
               shown_default=f"off for a directory, {SHARED_METADATA_TTL:g} for S3",
               help="how long a directory listing is trusted before the store is listed again"),
        Option("max_file_size", Kind.SIZE, "vfs.max_file_size", VfsConfig.max_file_size,
               bounds=(1 << 20, 1 << 50),
               help="writes and truncates past it fail with EFBIG (files may still be sparse: holes cost "
                    "nothing)"),
    )),
    ("Storage", (
        Option("chunk_size", Kind.SIZE, "vfs.chunk_size", VfsConfig.chunk_size, bounds=(64 << 10, 64 << 20),
               help="chunk (slot) size of files written by this mount",
               see=("why 4M", "decisions/chunk-size.md")),
        Option("stage_dir", Kind.PATH, "stage_dir", metavar="DIR",
               help="write to this local directory first and upload in the background"),
        Option("stage_size", Kind.SIZE, "stage_size", 16 << 30, bounds=(64 << 20, 1 << 50),
               help="most staged, not yet uploaded bytes; writers wait beyond it"),
        Option("cache_dir", Kind.PATH, "cache_dir", metavar="DIR",
               help="keep fetched chunk objects on local disk, verified on every use "
                    "(README.md, \"Disk cache\")"),
        Option("cache_dir_size", Kind.SIZE, "cache_dir_size", 8 << 30, bounds=(64 << 20, 1 << 50),
               help="most bytes kept in cache_dir; least recently used objects go first"),
        Option("gc_grace", Kind.SECONDS, "gc_grace", bounds=(0, WEEK),
               shown_default=f"0 for a directory, {SHARED_GC_GRACE:g} for S3",
               help="age below which unreferenced chunks are kept (another mount may be about to name them)"),
    )),
    ("Memory and parallelism", (
        Option("cache_size", Kind.SIZE, "vfs.cache_size", VfsConfig.cache_size, bounds=(0, 1 << 40),
               help="memory cache of decoded chunks"),
        Option("max_inflight", Kind.SIZE, "vfs.max_inflight", VfsConfig.max_inflight,
               bounds=(1 << 20, 1 << 40),
               help="bytes being compressed and stored at once; writers wait beyond it"),
        Option("max_dirty", Kind.SIZE, "vfs.max_dirty", VfsConfig.max_dirty, bounds=(1 << 20, 1 << 40),
               help="bytes of partly written chunks kept per file before they are stored early"),
        Option("readahead", Kind.SIZE, "vfs.readahead", VfsConfig.readahead, bounds=(0, 1 << 34),
               help="most a sequential reader is read ahead"),
        Option("threads", Kind.INT, "vfs.threads", VfsConfig.threads, bounds=(1, 256),
               shown_default="max(4, cores)", help="worker threads for compression and storage I/O"),
        Option("fetch_procs", Kind.INT, "fetch_procs", _fetch_procs_for_this_host, bounds=(0, 64),
               applies=S3_ONLY,
               shown_default=f"{FETCH_PROCS_ON_MANY_CORES} on {FETCH_PROCS_MIN_CORES}+ cores, else 0",
               help="processes that GET, decode and verify chunks from S3 outside the daemon's GIL; the "
                    "mount returns once they are ready", see=("why", "decisions/fetch-processes.md")),
        Option("write_procs", Kind.INT, "write_procs", 1, bounds=(0, 64), applies=DIRECTORY_ONLY,
               help="processes that hash, code and write the chunks of a directory store with the CPU "
                    "engine; 0: worker threads do it", see=("why", "decisions/write-processes.md")),
        Option("write_timeout", Kind.SECONDS, "write_timeout", PUT_TIMEOUT, bounds=(1, 86400),
               applies=DIRECTORY_ONLY,
               help="a write process that takes longer on one chunk is taken for hung: killed and replaced, "
                    "its chunk stored again"),
    )),
    ("Codec", (
        Option("engine", Kind.CHOICE, "engine", "auto", choices=("auto", "cpu", "gpu"),
               help="codec engine; auto takes the GPU engine where it is usable, else the CPU; gpu fails the "
                    "mount where no GPU engine is usable"),
        Option("gpu", Kind.INT, "gpu", 0, bounds=(0, 255), applies=GPU_ONLY,
               help="CUDA device the GPU engine uses"),
        Option("codec", Kind.CHOICE, "codec", "portable", choices=("portable", "ans"),
               help="portable chunks (zstd frames) are read by every engine; ans is nvCOMP ANS, GPU-only"),
        Option("level", Kind.INT, "level", 3, bounds=(1, 19), help="zstd level"),
    )),
    ("S3", (
        Option("endpoint_url", Kind.URL, "backend.endpoint_url", applies=S3_ONLY, shown_default="AWS",
               help="S3 endpoint (SeaweedFS, MinIO, Ceph RGW, StorageGRID, ...)"),
        Option("region", Kind.STRING, "backend.region", applies=S3_ONLY, shown_default="from the AWS chain",
               help="S3 region"),
        Option("profile", Kind.STRING, "backend.profile", applies=S3_ONLY, shown_default="from the AWS chain",
               help="profile in the shared AWS files"),
        Option("connect_timeout", Kind.SECONDS, "backend.connect_timeout", DEFAULT_CONNECT_TIMEOUT,
               bounds=(0.1, 600), applies=S3_ONLY, help="most a connection may take to open"),
        Option("read_timeout", Kind.SECONDS, "backend.read_timeout", DEFAULT_READ_TIMEOUT,
               bounds=(0.1, 3600), applies=S3_ONLY,
               help="most a server may stay silent before or within an answer"),
        Option("request_timeout", Kind.SECONDS, "backend.request_timeout", DEFAULT_REQUEST_TIMEOUT,
               bounds=(1, 86400), applies=S3_ONLY, see=("deadlines", "SEMANTICS.md#deadlines-s3"),
               help="most one request may take in all, retries included; then EIO and a log line; at least "
                    "connect_timeout + read_timeout"),
    )),
    ("Logging", (
        Option("log_file", Kind.PATH, "log_file",
               shown_default="a file named after the mountpoint in /var/log/nvfs (root) or "
                             "~/.local/state/nvfs",
               help="daemon log (stderr with -f)"),
        Option("log_level", Kind.CHOICE, "log_level", "info", choices=("debug", "info", "warning", "error"),
               help="least important messages logged"),
    )),
)
OPTIONS: tuple[Option, ...] = tuple(option for _title, options in GROUPS for option in options)
BY_NAME = {option.name: option for option in OPTIONS}


def is_ignored(name: str) -> bool:
    """Whether ``name`` is an option nvfs accepts and ignores: generic, for other tools, a comment."""
    return name in GENERIC_OPTIONS or name.startswith(IGNORED_PREFIX) or name == IGNORED_COMMENT


def find_option(name: str) -> Option:
    """The option called ``name``; an error naming the closest known one where there is one."""
    try:
        return BY_NAME[name]
    except KeyError:
        close = difflib.get_close_matches(name, BY_NAME, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise OptionError(f"unknown option {name!r}{hint}") from None
