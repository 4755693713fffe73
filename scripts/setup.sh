#!/usr/bin/env bash
# Install everything nvfs needs on a fresh Debian machine, as root: FUSE 3, Python packages,
# the nvfs command on root's PATH and the mount(8) helper. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

# gcc builds pyfuse3 and nvfs's C extension (setup.py); g++ builds the GPU engine's zstd frame
# code for the host in tests/test_zstd_huffman.py.
if ! command -v fusermount3 >/dev/null || [ ! -f /usr/include/fuse3/fuse.h ] || ! command -v g++ >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 libfuse3-dev pkg-config gcc g++ >/dev/null
fi
python3 -m pip install -q --disable-pip-version-check torch==2.13.0
python3 -m pip install -q --disable-pip-version-check -e '.[test]'

# mount(8) and fstab find the helper as /sbin/mount.fuse.nvfs; it needs nvfs on a short PATH.
scripts_dir=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
ln -sf "$scripts_dir/nvfs" /usr/local/bin/nvfs
install -m 755 mount_helpers/mount.fuse.nvfs /sbin/mount.fuse.nvfs
echo "nvfs installed: $(command -v nvfs)"
