"""Write docs/CONFIGURATION.md and README.md's options table from the options registry.

    python3 scripts/gen_configuration.py           # rewrite both
    python3 scripts/gen_configuration.py --check   # exit 1, naming the stale files, if either differs

The registry (nvfs/option_registry.py) is the one place an option is declared; these documents
are its rendering, and tests/test_options.py fails when a committed one is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nvfs.option_docs import GENERATOR, render_markdown, with_readme_table  # noqa: E402

CONFIGURATION = ROOT / "docs" / "CONFIGURATION.md"
README = ROOT / "README.md"


def expected() -> dict[Path, str]:
    """Each generated document and the text it should have now."""
    return {CONFIGURATION: render_markdown(), README: with_readme_table(README.read_text())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    args = parser.parse_args()
    stale = [path for path, text in expected().items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} is stale: run {GENERATOR}", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(expected()[path])
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
