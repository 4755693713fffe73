"""How a scenario reports: table cells, acceptance lines, and one JSON result file per run.

The printed table is for reading; the JSON file (``--json PATH``, by default
``benchmarks/results/<scenario>-<commit>.json``, a git-ignored folder) is for comparing runs:
the commit, the machine, the options, every raw trial and every acceptance line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

Ordered = TypeVar("Ordered", float, tuple[float, str])
RESULTS = Path(__file__).resolve().parents[1] / "results"


def fmt(value: float | None, spec: str, missing: str = "n/a") -> str:
    """``format(value, spec)``, or ``missing`` for None and NaN (a value not measured)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)


def median(values: list[Ordered]) -> Ordered:
    """The median, the lower middle one of an even count (a value that was measured)."""
    return sorted(values)[(len(values) - 1) // 2]


@dataclass
class Check:
    """One acceptance line: ``ok`` is None where the check could not be made here."""

    name: str
    ok: bool | None
    detail: str = ""

    def line(self) -> str:
        verdict = "n/a " if self.ok is None else ("PASS" if self.ok else "FAIL")
        return f"  [{verdict}] {self.name}" + (f": {self.detail}" if self.detail else "")


def print_acceptance(checks: list[Check], title: str = "acceptance") -> bool:
    """Print the checks and a verdict; True when none failed (those that could not be made pass)."""
    print(f"{title}:")
    for check in checks:
        print(check.line())
    made = [c for c in checks if c.ok is not None]
    passed = all(c.ok is not False for c in checks)
    not_made = f", {len(checks) - len(made)} n/a" if len(made) < len(checks) else ""
    print(f"  overall: {'PASS' if passed else 'FAIL'} "
          f"({sum(bool(c.ok) for c in made)} of {len(made)} checks met{not_made})")
    return passed


def plain(value: Any) -> Any:
    """``value`` as JSON can hold it: dataclasses as dicts, paths as strings, NaN as null."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


@dataclass
class Result:
    """What one run of a scenario leaves behind, besides its printed table."""

    scenario: str
    args: argparse.Namespace
    machine: dict[str, Any]
    rows: list[Any] = field(default_factory=list)
    trials: dict[str, Any] = field(default_factory=dict)
    acceptance: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def write(self) -> Path:
        """Write the JSON file (``--json`` or the default path) and say where it went."""
        path = self.args.json or RESULTS / f"{self.scenario}-{self.machine['commit']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        document = {"scenario": self.scenario, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "machine": self.machine, "options": vars(self.args), "rows": self.rows,
                    "trials": self.trials, "acceptance": self.acceptance, "notes": self.notes}
        path.write_text(json.dumps(plain(document), indent=1) + "\n")
        print(f"result: {path}")
        return path
