"""The ``nvfs`` command: mount, umount, stat.

Errors are one line on stderr and a non-zero exit (1 for failures, 2 for usage).
``nvfs SOURCE MOUNTPOINT -o ...`` (no sub-command) is ``nvfs mount``, the form that
``mount.fuse3`` uses.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

from nvfs.backend import Backend, BackendError, StagedBackend, open_backend
from nvfs.codec import CodecError, make_engine
from nvfs.daemon import default_log_file, run_in_background, serve, setup_logging
from nvfs.option_docs import render_help
from nvfs.option_registry import SHARED_METADATA_TTL
from nvfs.options import MountOptions, OptionError, parse_options
from nvfs.store import ChunkFileCache, ChunkProcessPool, DiskCacheError, SharedChunkBuffers, Store, StoreError

COMMANDS = ("mount", "umount", "stat")
XATTR = "user.nvfs."


class CliError(Exception):
    """A failure to report as one line and exit 1."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nvfs", description="A FUSE filesystem for checkpoints.")
    commands = parser.add_subparsers(dest="command", required=True)
    mount = commands.add_parser("mount", help="mount a store (a directory or an S3 prefix) on a mountpoint",
                                epilog=render_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    mount.add_argument("source", help="backing directory of the store (created on first mount if empty), "
                                      "or s3://BUCKET/PREFIX")
    mount.add_argument("mountpoint")
    mount.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT=VAL...]",
                       help="mount options, listed below")
    mount.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    umount = commands.add_parser("umount", help="unmount and wait until the daemon has stored everything")
    umount.add_argument("mountpoint")
    umount.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the daemon")
    stat = commands.add_parser("stat", help="logical size, stored size, ratio and codec of files")
    stat.add_argument("paths", nargs="+", metavar="PATH", help="files or directories on an nvfs mount")
    stat.add_argument("--json", action="store_true", help="one JSON object per line")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in COMMANDS and not argv[0].startswith("-"):
        argv.insert(0, "mount")
    args = _parser().parse_args(argv)
    handler = {"mount": cmd_mount, "umount": cmd_umount, "stat": cmd_stat}[args.command]
    try:
        return handler(args)
    except (CliError, OptionError, BackendError, StoreError, CodecError, DiskCacheError) as exc:
        print(f"nvfs {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


# ----- mount ------------------------------------------------------------------------------

def _check_mountpoint(path: str) -> str:
    if not os.path.exists(path):
        raise CliError(f"mountpoint {path}: no such directory")
    if not os.path.isdir(path):
        raise CliError(f"mountpoint {path}: not a directory")
    if os.path.ismount(path):
        raise CliError(f"mountpoint {path} is busy: something is already mounted there")
    return os.path.abspath(path)


def cmd_mount(args: argparse.Namespace) -> int:
    options = parse_options(args.options)
    mountpoint = _check_mountpoint(args.mountpoint)
    source = args.source if args.source.startswith("s3://") else os.path.abspath(args.source)
    backend = open_backend(source, options.backend)
    if options.stage_dir:
        backend = StagedBackend(backend, os.path.abspath(options.stage_dir), options.stage_size)
    disk_cache = None
    if options.cache_dir:
        disk_cache = ChunkFileCache(os.path.abspath(options.cache_dir), options.cache_dir_size)
    backend.lock()
    if backend.shared and options.vfs.metadata_ttl is None:
        options.vfs.metadata_ttl = SHARED_METADATA_TTL
    if args.foreground:
        setup_logging(options.log_file, options.log_level)
        store = open_store(backend, options, disk_cache)
        return serve(store, source, mountpoint, options, _report_foreground)
    log_file = options.log_file or default_log_file(mountpoint)

    def run(ready) -> int:
        setup_logging(log_file, options.log_level)
        try:
            store = open_store(backend, options, disk_cache)
        except (BackendError, StoreError, CodecError) as exc:
            ready(str(exc))
            return 1
        return serve(store, source, mountpoint, options, ready)

    return run_in_background(run)


def open_store(backend: Backend, options: MountOptions, disk_cache: ChunkFileCache | None) -> Store:
    """The codec engine, then the store: a refused engine leaves the source as it was.

    Called in the daemon process, after the fork: a CUDA context does not survive ``fork``.
    """
    engine = make_engine(options.engine, options.level, gpu=options.gpu, codec=options.codec)
    fetch_pool = ChunkProcessPool(options.fetch_procs, options.vfs.threads) if options.fetch_procs else None
    write_pool = buffers = None
    if options.write_procs:
        write_pool = ChunkProcessPool(options.write_procs, options.vfs.threads, options.write_timeout)
        # Room for every chunk in flight and one being written per worker; past that, chunks
        # are buffered and stored in the daemon. Pages are only allocated once used.
        chunk = options.vfs.chunk_size
        buffers = SharedChunkBuffers(options.vfs.max_inflight // chunk + options.vfs.threads, chunk)
    return Store.open(backend, engine, options.gc_grace, disk_cache, fetch_pool, write_pool, buffers)


def _report_foreground(error: str | None) -> None:
    if error:
        print(f"nvfs mount: {error}", file=sys.stderr)


# ----- umount -----------------------------------------------------------------------------

def cmd_umount(args: argparse.Namespace) -> int:
    mountpoint = os.path.abspath(args.mountpoint)
    if not os.path.ismount(mountpoint):
        raise CliError(f"{mountpoint} is not mounted")
    try:
        pid = int(os.getxattr(mountpoint, XATTR + "pid"))
    except (OSError, ValueError):
        raise CliError(f"{mountpoint} is not an nvfs mount") from None
    result = subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True, text=True)
    if result.returncode != 0:
        raise CliError(result.stderr.strip() or f"fusermount3 -u {mountpoint} failed")
    if not _wait_for_exit(pid, args.timeout):
        raise CliError(f"unmounted, but daemon {pid} is still storing data after {args.timeout:.0f}s")
    return 0


def _wait_for_exit(pid: int, timeout: float) -> bool:
    """Wait for the daemon to finish its last commits and exit (it is not our child: poll).

    A daemon that has exited but not yet been reaped by init is a zombie: it counts as gone.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False


# ----- stat -------------------------------------------------------------------------------

def _files(paths: list[str]) -> Iterator[str]:
    for path in paths:
        if not os.path.lexists(path):
            raise CliError(f"{path}: no such file or directory")
        if os.path.isdir(path) and not os.path.islink(path):
            for directory, _dirs, names in sorted(os.walk(path)):
                for name in sorted(names):
                    full = os.path.join(directory, name)
                    if os.path.isfile(full) and not os.path.islink(full):
                        yield full
        else:
            yield path


def _file_stat(path: str) -> dict:
    def attr(name: str) -> str:
        return os.getxattr(path, XATTR + name).decode()

    try:
        logical, stored = int(attr("logical_size")), int(attr("stored_size"))
        return {"path": path, "logical_size": logical, "stored_size": stored,
                "ratio": round(logical / stored, 4) if stored else None,
                "codec": attr("codec"), "engine": attr("engine"), "chunks": int(attr("chunks")),
                "committed": attr("committed") == "yes"}
    except OSError:
        raise CliError(f"{path}: not a file on an nvfs mount") from None


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def cmd_stat(args: argparse.Namespace) -> int:
    rows = [_file_stat(path) for path in _files(args.paths)]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    width = max([len("codec"), *(len(row["codec"]) for row in rows)])
    print(f"{'logical':>12} {'stored':>12} {'ratio':>7}  {'codec':<{width}} path")
    for row in rows:
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] else "-"
        print(f"{_human(row['logical_size']):>12} {_human(row['stored_size']):>12} {ratio:>7}  "
              f"{row['codec']:<{width}} {row['path']}")
    if len(rows) > 1:
        logical = sum(row["logical_size"] for row in rows)
        stored = sum(row["stored_size"] for row in rows)
        ratio = f"{logical / stored:.2f}x" if stored else "-"
        print(f"{_human(logical):>12} {_human(stored):>12} {ratio:>7}  {'':<{width}} "
              f"total ({len(rows)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
