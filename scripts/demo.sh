#!/usr/bin/env bash
# Set everything up, mount a local store at /mnt/ckpt, save a real torch training checkpoint
# into it and show what it cost to store. Unmount afterwards with: nvfs umount /mnt/ckpt
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
store=${NVFS_STORE:-/var/lib/nvfs/store}
mountpoint=${NVFS_MOUNTPOINT:-/mnt/ckpt}
mkdir -p "$store" "$mountpoint"
if ! mountpoint -q "$mountpoint"; then
    nvfs mount "$store" "$mountpoint"
    echo "mounted $store on $mountpoint (log: /var/log/nvfs/)"
fi
python3 scripts/demo_checkpoint.py "$mountpoint/demo/step_40.pt"
nvfs stat "$mountpoint/demo"
