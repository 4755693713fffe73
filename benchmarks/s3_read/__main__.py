"""``python3 -m benchmarks.s3_read``: the options, the SeaweedFS server, the parts in turn, the table."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks import s3_read
from benchmarks.harness import cli
from benchmarks.harness.files import log_tail
from benchmarks.harness.report import Result, print_acceptance
from benchmarks.harness.system import load_note, tool_version
from benchmarks.harness.units import human
from benchmarks.s3_read.cold_reads import BUCKET_NVFS, BUCKET_PLAIN
from benchmarks.s3_read.lazy_open import SAFETENSORS_TENSORS, part2
from benchmarks.s3_read.memory import HEADROOM, part3
from benchmarks.s3_read.restore import compare_options, part1
from benchmarks.s3_read.table import Results, print_table
from nvfs.options import parse_options
from nvfs.testing.seaweed import SeaweedServer


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.s3_read",
                                     description=(s3_read.__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--size-mib", type=int, default=2048,
                        help="checkpoint size for part 1 (default 2048)")
    parser.add_argument("--st-mib", type=int, default=1024,
                        help=f"safetensors size for part 2, {SAFETENSORS_TENSORS} tensors (default 1024)")
    parser.add_argument("--rss-mib", type=int, default=8192, help="file size for part 3 (default 8192)")
    parser.add_argument("--mount-options", default="",
                        help="extra nvfs -o options for every mount, e.g. cache_size=512M,readahead=128M")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 256 MiB checkpoint, 64 MiB safetensors, 512 MiB RSS run")
    parser.add_argument("--adam-steps", type=int, default=3, help="AdamW steps to build optimizer state")
    parser.add_argument("--parts", default="123", help="which parts to run (default 123)")
    parser.add_argument("--trials", type=int, default=3,
                        help="cold cats of part 1, each followed by a cold get_object; medians count "
                             "(default 3)")
    parser.add_argument("--compare", action="append", default=[], metavar="OPTIONS",
                        help="instead of part 1's rows: cold cats with the mount options and with "
                             "these extra -o options (repeatable), in turn, --trials rounds")
    cli.add_common_args(parser)
    args = parser.parse_args(argv)
    if not set(args.parts) <= set("123"):
        parser.error("--parts takes digits among 1, 2 and 3")
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    if args.quick:
        args.size_mib, args.st_mib, args.rss_mib = 256, 64, 512
    return args


def header_lines(args: argparse.Namespace, bound: int) -> list[str]:
    """The mount options in effect, the memory bound and the sizes, for the run's header."""
    config = parse_options([args.mount_options]).vfs
    extra = f",{args.mount_options}" if args.mount_options else ""
    ttl = f"{config.metadata_ttl:g} s" if config.metadata_ttl is not None else "5 s (S3)"
    return [f"SeaweedFS {tool_version('weed', 'version')} on the same machine",
            f"mount options: endpoint_url=<local SeaweedFS>,log_file=<workdir>{extra} "
            f"(part 2's measuring mount: endpoint_url=<counting relay>); effective: "
            f"chunk_size={human(config.chunk_size)}, cache_size={human(config.cache_size)}, "
            f"max_inflight={human(config.max_inflight)}, max_dirty={human(config.max_dirty)}, "
            f"readahead={human(config.readahead)}, threads={config.threads}, metadata_ttl={ttl}",
            f"RSS bound: cache_size + max_inflight + 256 MiB = {human(bound)}",
            f"sizes: checkpoint {args.size_mib} MiB, safetensors {args.st_mib} MiB, "
            f"RSS run {args.rss_mib} MiB"]


def run_parts(args: argparse.Namespace, server: SeaweedServer, work: Path, results: Results,
              bound: int) -> None:
    """Start the server and run the parts asked for, each adding its rows to ``results``."""
    server.start()
    server.create_bucket(BUCKET_NVFS)
    server.create_bucket(BUCKET_PLAIN)
    print(f"SeaweedFS up in {server.start_seconds:.1f} s at {server.endpoint_url}", flush=True)
    if args.compare:
        compare_options(args, server, work, results, args.mount_options)
    elif "1" in args.parts:
        part1(args, server, work, results, args.mount_options)
    if "2" in args.parts:
        part2(args, server, work, results, args.mount_options)
    if "3" in args.parts:
        part3(args, server, work, results, args.mount_options, bound)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = parse_options([args.mount_options]).vfs  # what the daemon will run with
    bound = config.cache_size + config.max_inflight + HEADROOM
    with cli.workdir(args, "s3") as work:
        result = Result("s3_read", args, cli.print_header(work, *header_lines(args, bound)))
        started = time.perf_counter()
        results = Results()
        server = SeaweedServer(work / "seaweed")
        try:
            run_parts(args, server, work, results, bound)
            print()
            print_table(results)
            print()
            print_acceptance(results.acceptance)
            print(f"\ntotal runtime {time.perf_counter() - started:.1f} s; after: {load_note(server.pid)}")
        except BaseException:
            if results.rows:
                print("\npartial results:")
                print_table(results)
            for log_file in sorted(work.glob("nvfs-*.log")):
                print(f"{log_file.name} (last 30 lines without DEBUG):\n{log_tail(log_file, skip=' DEBUG ')}",
                      file=sys.stderr)
            print(f"weed log (tail):\n{server.log_tail(20)}", file=sys.stderr)
            raise
        finally:
            server.close()
            result.rows, result.acceptance, result.notes = results.rows, results.acceptance, results.notes
            result.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
