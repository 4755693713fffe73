"""Mount options (``-o a,b=c``): nvfs's own, FUSE's, and generic ones that are ignored.

What each option is, accepts and defaults to is declared in nvfs/option_registry.py; this
module applies a mount's ``-o`` arguments to it and yields the :class:`MountOptions` the
daemon runs with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nvfs.backend.deadlines import Deadlines
from nvfs.option_registry import OPTIONS, Option, OptionError, find_option, is_ignored
from nvfs.vfs import VfsConfig

__all__ = ["MountOptions", "OptionError", "default_options", "parse_options"]

_DEADLINES = ("connect_timeout", "read_timeout", "request_timeout")


@dataclass
class MountOptions:
    """Everything ``-o`` decided; each field is the ``dest`` of one registered option.

    Built by :func:`parse_options` (or :func:`default_options`), which fill in the registry's
    defaults: the fields have none of their own.
    """

    vfs: VfsConfig  # the vfs's tunables (``vfs.NAME`` options)
    engine: str
    gpu: int  # CUDA device of the GPU engine
    codec: str  # chunk coding: portable (every engine reads it) or ans (GPU-only)
    level: int
    log_file: str | None
    log_level: str
    gc_grace: float | None  # None: the store's default for its backend
    stage_dir: str | None
    stage_size: int
    cache_dir: str | None
    cache_dir_size: int
    cached_writes: bool  # whole-file write-only handles go through the page cache too
    fetch_procs: int
    write_procs: int
    write_timeout: float  # seconds a write process may take on one chunk: then it is hung
    fuse: set[str] = field(default_factory=set)  # FUSE options passed to the kernel
    # S3 settings given (endpoint_url, region, profile, the deadlines); the backend's defaults otherwise
    backend: dict[str, str | float] = field(default_factory=dict)


def default_options() -> MountOptions:
    """What a mount runs with when no ``-o`` option is given."""
    own = {option.dest: option.initial() for option in OPTIONS if "." not in option.dest}
    return MountOptions(vfs=VfsConfig(), **own)


def parse_options(specs: list[str]) -> MountOptions:
    """Parse every ``-o`` argument (each a comma-separated list) into :class:`MountOptions`."""
    options = default_options()
    for spec in specs:
        for item in filter(None, (part.strip() for part in spec.split(","))):
            name, has_value, value = item.partition("=")
            if not is_ignored(name):
                option = find_option(name)
                _assign(options, option, option.parse(value if has_value else None))
    _check_deadlines(options.backend)
    return options


def _assign(options: MountOptions, option: Option, value: object) -> None:
    """Put ``value`` where the option's ``dest`` says."""
    where, _, attribute = option.dest.rpartition(".")
    if where == "vfs":
        setattr(options.vfs, attribute, value)
    elif where == "backend":
        options.backend[attribute] = value
    elif where == "fuse":
        options.fuse.add(attribute)
    else:
        setattr(options, attribute, value)


def _check_deadlines(backend: dict[str, str | float]) -> None:
    """The deadlines, as given or by default, must let one whole attempt finish in time."""
    given = {name: float(backend[name]) for name in _DEADLINES if name in backend}
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
