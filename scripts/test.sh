#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite with real FUSE mounts.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ruff check nvfs tests benchmarks
python3 -m pytest -q tests "$@"
