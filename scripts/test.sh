#!/usr/bin/env bash
# Run nvfs's tests (docs/DEVELOPMENT.md, "Tests").
#
#   scripts/test.sh [pytest args]         CI (.ci/run): set up the machine (scripts/setup.sh),
#                                         lint, run the whole suite with real FUSE mounts
#   scripts/test.sh TIER [pytest args]    on a machine already set up: lint, run one tier
#
# Tiers: unit (no mount, no server), fast (unit without the slow tests, plus smoke mounts),
# fuse (mounts of directory stores), s3 (a SeaweedFS server), gpu (CUDA and nvCOMP).
# e.g. scripts/test.sh fuse -x tests/test_posix.py
set -euo pipefail
cd "$(dirname "$0")/.."

# The pytest -m expression of each tier, from the markers in pyproject.toml.
tier_markers() {
    case "$1" in
        unit) echo "unit" ;;
        fast) echo "(unit and not slow) or (smoke and not s3 and not gpu)" ;;
        fuse) echo "fuse and not s3 and not gpu" ;;
        s3) echo "s3 and not gpu" ;;
        gpu) echo "gpu" ;;
        *) return 1 ;;
    esac
}

if [ $# -gt 0 ] && markers=$(tier_markers "$1"); then
    shift
    ruff check nvfs tests benchmarks
    exec python3 -m pytest -q -m "$markers" "$@"
fi

bash scripts/setup.sh
ruff check nvfs tests benchmarks
python3 -m pytest -q tests "$@"
