"""The rows of the S3 read scenario, printed as each is measured and again as one table at the end."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from benchmarks.harness.report import Check


@dataclass
class Row:
    """One measurement: ``part`` is the docstring's numbering (1a, 2, ...)."""

    part: str
    what: str
    seconds: float
    logical: int | None = None  # bytes, for GB/s
    vs_plain: float | None = None  # GB/s as a multiple of the best plain download
    detail: str = ""

    @property
    def gbps(self) -> float | None:
        if self.logical is None or not self.seconds or math.isnan(self.seconds):
            return None
        return self.logical / self.seconds / 1e9


@dataclass
class Results:
    """Every row, note and acceptance check of a run, in the order they were made."""

    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    acceptance: list[Check] = field(default_factory=list)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        gbps = f", {row.gbps:.3f} GB/s" if row.gbps is not None else ""
        secs = "" if math.isnan(row.seconds) else f": {row.seconds:.2f} s"
        print(f"  [{row.part}] {row.what}{secs}{gbps}  {row.detail}", flush=True)
        return row


def print_table(results: Results) -> None:
    header = f"{'part':<4} {'measurement':<48} {'seconds':>8} {'GB/s':>7} {'x plain':>8}  detail"
    print(header)
    print("-" * 130)
    for r in results.rows:
        gbps = f"{r.gbps:.3f}" if r.gbps is not None else "-"
        vs = f"{r.vs_plain:.2f}x" if r.vs_plain is not None else "-"
        secs = "-" if math.isnan(r.seconds) else f"{r.seconds:.2f}"
        print(f"{r.part:<4} {r.what:<48} {secs:>8} {gbps:>7} {vs:>8}  {r.detail}")
    print("(GB/s: logical bytes / seconds, 1 GB = 1e9 B; x plain: nvfs GB/s / best plain boto3 GB/s; "
          "daemon CPU and VmHWM: the nvfs daemon with its fetch processes)")
    for note in results.notes:
        print(f"  {note}")
