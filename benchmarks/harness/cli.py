"""The command-line options every scenario shares, and a run's temp dir and header."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.harness import system
from benchmarks.harness.files import make_workdir
from benchmarks.harness.mounts import unmount_below


def add_common_args(parser: argparse.ArgumentParser, workdir_help: str | None = None) -> None:
    """--workdir, --seed, --keep and --json, the same in every scenario."""
    parser.add_argument("--workdir", type=Path, default=None,
                        help=workdir_help or "parent of the benchmark's fresh temp dir (default /var/tmp)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (stores, logs)")
    add_json_arg(parser)


def add_json_arg(parser: argparse.ArgumentParser) -> None:
    """--json PATH: where the run's JSON result goes."""
    parser.add_argument("--json", type=Path, default=None,
                        help="where the JSON result goes "
                             "(default benchmarks/results/<scenario>-<commit>.json)")


def raise_on_sigterm(signum: int, _frame: object) -> None:
    """Turn SIGTERM into SystemExit so ``finally`` blocks unmount and clean up."""
    raise SystemExit(128 + signum)


def print_header(work: Path | None, *lines: str) -> dict[str, Any]:
    """Print the command, the machine and ``lines``; returns the machine for the JSON result."""
    machine = system.machine(work)
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"machine: {system.machine_line(machine)}; nvfs {machine['commit']}")
    if work is not None:
        print(f"workdir: {work}; {system.load_note()}")
    for line in lines:
        print(line)
    sys.stdout.flush()
    return machine


@contextlib.contextmanager
def workdir(args: argparse.Namespace, scenario: str) -> Iterator[Path]:
    """A fresh temp dir for the run, removed afterwards (not with ``--keep``), also after SIGTERM.

    Whatever is still mounted below it is unmounted first, and the dir is left in place if a
    mount cannot be removed: never delete through a mount.
    """
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    work = make_workdir(args.workdir, f"nvfs-bench-{scenario}-")
    try:
        yield work
    finally:
        left = unmount_below(work)
        if args.keep:
            print(f"kept {work}")
        elif not left:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"warning: {work} left in place: a mount under it could not be removed", file=sys.stderr)
