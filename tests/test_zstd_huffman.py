"""The GPU engine's Huffman-only zstd frames, checked on the CPU against libzstd.

The device functions of nvfs/codec/zstd_huffman.cu are host functions too: this test builds
them with the system C++ compiler, drives them the way the ``encode_frames`` kernel does
(every lane of every stream, then the headers) and decodes each frame with the ``zstandard``
package, so that the portable format is checked on machines without a GPU. The GPU itself
runs the same code in tests/test_gpu.py.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import zstandard

from nvfs.codec import planes as plane_module
from nvfs.codec.base import ElementKind
from nvfs.codec.planes import PlaneCoder, to_planes

pytestmark = pytest.mark.unit

KERNELS = Path(__file__).resolve().parent.parent / "nvfs" / "codec" / "zstd_huffman.cu"
FRAME = 64 << 10

# One frame as encode_frames makes it, with the table of `plane_counts` (the frame's plane).
DRIVER = r"""
#include <cstring>
#define __host__
#define __device__
#define __global__
#define __noinline__
#define NVFS_HOST_BUILD
#include "KERNELS"

extern "C" long long encode_frame(const u8* data, u32 size, const u32* plane_counts, u8* out) {
    u32 table[256];
    u8 description[DESCRIPTION_STRIDE];
    int described = huffman_table(plane_counts, table, description);
    u32 counts[256] = {0};
    int distinct = 0, symbol = -1;
    for (u32 i = 0; i < size; i++) counts[data[i]]++;
    for (int s = 0; s < 256; s++) if (counts[s]) { distinct++; symbol = s; }
    if (distinct != 1) symbol = -1;
    if (symbol >= 0 || size < MIN_CODED) described = 0;
    u32 bits[4][LANES], stream_bytes[4];
    long long first[4][LANES], last[4][LANES], start[4];
    for (int s = 0; s < 4; s++) {
        long long count;
        stream_span(size, s, &start[s], &count);
        long long share = (count + LANES - 1) / LANES;
        u32 total = 0;
        for (int lane = 0; lane < LANES; lane++) {
            first[s][lane] = lane * share < count ? lane * share : count;
            last[s][lane] = first[s][lane] + share < count ? first[s][lane] + share : count;
            bits[s][lane] = described ? coded_bits(data + start[s] + first[s][lane],
                                                   last[s][lane] - first[s][lane], table) : 0;
            total += bits[s][lane];
        }
        stream_bytes[s] = total / 8 + 1;
    }
    u32 head, length;
    int mode = frame_layout(size, symbol, described, stream_bytes, &head, &length);
    if (mode == MODE_RAW) memcpy(out + head, data, size);
    if (mode == MODE_HUFFMAN) {
        u32* words = (u32*)out;
        for (u32 w = head / 4; w < (length + 3) / 4; w++) words[w] = 0;
        u64 stream_start = head;
        for (int s = 0; s < 4; s++) {
            for (int lane = 0; lane < LANES; lane++) {
                u64 at = 8 * stream_start;
                for (int k = lane + 1; k < LANES; k++) at += bits[s][k];
                put_codes(data + start[s] + first[s][lane], last[s][lane] - first[s][lane], table, words, at);
                if (lane == 0) or_word(words + (at + bits[s][0]) / 32, 1u << ((at + bits[s][0]) % 32));
            }
            stream_start += stream_bytes[s];
        }
    }
    write_head(out, mode, size, symbol, description, described, stream_bytes, length);
    return length;
}

// A frame decoded as decode_frames does: 0, FRAME_UNSUPPORTED or FRAME_DAMAGED.
extern "C" int decode_frame(const u8* frame, u32 length, u32 size, u8* out) {
    u8 weights[256];
    u16 start[256], table[1 << HUF_MAX_BITS];
    FrameContent content;
    int result = parse_frame(frame, length, size, weights, &content);
    if (result) return result;
    if (content.kind == CONTENT_RAW) memcpy(out, frame + content.offset, size);
    if (content.kind == CONTENT_RLE) memset(out, frame[content.offset], size);
    if (content.kind != CONTENT_HUFFMAN) return 0;
    huffman_starts(weights, content.symbols, content.max_bits, start);
    for (int s = 0; s < content.symbols; s++) fill_symbol(table, start[s], weights[s], content.max_bits, s);
    u32 offset = content.offset;
    for (int k = 0; k < content.streams; k++) {
        long long first = 0, count = size;
        if (content.streams == 4) stream_span(size, k, &first, &count);
        int damaged = decode_stream(frame + offset, content.stream_length[k], table, content.max_bits,
                                    out + first, (u32)count);
        if (damaged) return damaged;
        offset += content.stream_length[k];
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler to build zstd_huffman.cu for the host (apt-get install g++)")
    build = tmp_path_factory.mktemp("zstd_huffman")
    source = build / "driver.cpp"
    source.write_text(DRIVER.replace("KERNELS", str(KERNELS)))
    library = build / "driver.so"
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(library), str(source)],
                   check=True)
    lib = ctypes.CDLL(str(library))
    lib.encode_frame.restype = ctypes.c_longlong
    lib.encode_frame.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p]
    lib.decode_frame.restype = ctypes.c_int
    lib.decode_frame.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p]
    return lib


@pytest.fixture(scope="module")
def encoder(library):
    def encode_plane(plane: np.ndarray, table_counts: np.ndarray | None = None) -> list[bytes]:
        """The plane's frames, each coded with the table of the whole plane's counts."""
        counts = np.bincount(plane, minlength=256).astype(np.uint32) if table_counts is None else table_counts
        frames = []
        for start in range(0, len(plane), FRAME):
            frame = np.ascontiguousarray(plane[start : start + FRAME])
            out = np.full(FRAME + 4096, 0xAB, dtype=np.uint8)  # stale bytes must not leak in
            length = library.encode_frame(frame.ctypes.data, len(frame), counts.ctypes.data, out.ctypes.data)
            frames.append(out[:length].tobytes())
        return frames

    return encode_plane


@pytest.fixture(scope="module")
def gpu_decode(library):
    """decode_frames' logic on one frame: (status, bytes); the frame gets slack on both sides."""
    def decode(frame: bytes, size: int) -> tuple[int, bytes]:
        padded = np.zeros(len(frame) + 32, dtype=np.uint8)
        padded[16 : 16 + len(frame)] = np.frombuffer(frame, dtype=np.uint8)
        out = np.zeros(max(size, 1), dtype=np.uint8)
        status = library.decode_frame(padded.ctypes.data + 16, len(frame), size, out.ctypes.data)
        return status, out[:size].tobytes()

    return decode


def decoded(frames: list[bytes]) -> bytes:
    decompressor = zstandard.ZstdDecompressor()
    return b"".join(decompressor.decompress(frame) for frame in frames)


def frame_sizes(plane_length: int) -> list[int]:
    return [min(FRAME, plane_length - start) for start in range(0, plane_length, FRAME)]


def float_values(kind: ElementKind, count: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    weights = (rng.standard_normal(count) * 0.02).astype(np.float32)
    if kind == ElementKind.BF16:
        return (weights.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return weights.tobytes()


@pytest.mark.parametrize("kind", [ElementKind.BF16, ElementKind.FP32])
def test_exponent_planes_decode_and_match_the_cpu_engine(encoder, kind):
    data = float_values(kind, 1 << 20, seed=1)
    exponents = to_planes(memoryview(data), kind)[0]
    frames = encoder(exponents)
    assert decoded(frames) == exponents.tobytes()
    ours = sum(len(frame) for frame in frames)
    _, cpu = PlaneCoder(3).compress_float_plane(exponents.copy())
    assert ours <= 1.01 * len(cpu), f"{ours} bytes vs the CPU engine's {len(cpu)}"
    assert len(exponents) / ours > 2.5  # an exponent plane holds under 3 bits of entropy per byte


def test_a_frame_of_one_byte_value_is_a_tiny_rle_frame(encoder):
    zeros = np.zeros(3 * FRAME + 5, dtype=np.uint8)
    frames = encoder(zeros)
    assert decoded(frames) == zeros.tobytes()
    assert all(len(frame) == 13 for frame in frames)


def test_near_random_and_small_frames_are_stored_raw(encoder):
    rng = np.random.default_rng(2)
    for plane in (rng.integers(0, 129, 200_001, dtype=np.uint8), rng.integers(0, 100, 300, dtype=np.uint8),
                  rng.integers(0, 3, 20, dtype=np.uint8)):
        frames = encoder(plane)
        assert decoded(frames) == plane.tobytes()
        assert sum(len(frame) for frame in frames) <= len(plane) + 12 * len(frames)


@pytest.mark.parametrize("label, plane", [
    ("two symbols", np.random.default_rng(3).integers(0, 2, 300_000, dtype=np.uint8)),
    ("odd length, byte value 128", np.random.default_rng(4).integers(120, 129, 131_071, dtype=np.uint8)),
    ("codes limited to 11 bits", np.repeat(np.arange(40, dtype=np.uint8),
                                           (1.7 ** np.arange(40) / 1.7**20 * 50 + 1).astype(np.int64))),
    ("skewed", np.minimum(np.random.default_rng(5).geometric(0.3, 400_000), 128).astype(np.uint8)),
    ("byte values above 128: FSE-coded weights",
     np.minimum(np.random.default_rng(7).geometric(0.05, 300_000) + 60, 255).astype(np.uint8)),
])
def test_frames_decode_exactly(encoder, label, plane):
    frames = encoder(plane)
    assert decoded(frames) == plane.tobytes(), label
    assert sum(len(frame) for frame in frames) < len(plane), label


def test_even_byte_values_up_to_254_code_as_well_as_on_the_cpu(encoder):
    """The lowest plane of Adam's second moment: its sign bit is always 0, so 7 bits of entropy
    over byte values up to 254, which only FSE-coded Huffman weights describe."""
    squares = (np.random.default_rng(8).standard_normal(1 << 20) * 1e-4) ** 2
    plane = to_planes(memoryview(squares.astype(np.float32).tobytes()), ElementKind.FP32)[3]
    frames = encoder(plane)
    assert decoded(frames) == plane.tobytes()
    ours = sum(len(frame) for frame in frames)
    _, cpu = PlaneCoder(3).compress_float_plane(plane.copy())
    assert ours <= 1.01 * len(cpu) < 0.9 * len(plane)


def test_a_frame_may_lack_symbols_of_its_planes_table(encoder):
    plane = np.random.default_rng(6).integers(0, 8, 100_000, dtype=np.uint8)
    table_counts = np.bincount(plane, minlength=256).astype(np.uint32)
    table_counts[[9, 60, 128]] = [5, 1, 1]  # described by the table, absent from the data
    frames = encoder(plane, table_counts)
    assert decoded(frames) == plane.tobytes()


SUPPORTED, UNSUPPORTED, DAMAGED = 0, 1, 2


@pytest.mark.parametrize("kind", [ElementKind.BF16, ElementKind.FP32])
def test_the_gpu_decoder_reads_its_own_frames_and_leaves_others_to_nvcomp(encoder, gpu_decode, kind,
                                                                         monkeypatch):
    data = float_values(kind, 1 << 20, seed=11)
    for plane in to_planes(memoryview(data), kind):
        for frame, size in zip(encoder(plane), frame_sizes(len(plane)), strict=True):
            assert gpu_decode(frame, size) == (SUPPORTED, plane[:size].tobytes())
            plane = plane[size:]
    # The CPU engine's frames: its Huffman-only ones (nvfs.codec._huffman, this file's code) are
    # read here; zstd's, with a few matches (sequences), are left to nvCOMP, never misread.
    for coder in ("huffman", "zstd"):
        if coder == "zstd":
            monkeypatch.setattr(plane_module, "huffman", None)
        exponents = to_planes(memoryview(data), kind)[0]
        entry, payload = PlaneCoder(3).compress_float_plane(exponents.copy())
        start, statuses = 0, set()
        for length in entry.frame_lengths:
            size = min(entry.frame_size, len(exponents))
            status, out = gpu_decode(bytes(payload[start : start + length]), size)
            assert status == UNSUPPORTED or (status, out) == (SUPPORTED, exponents[:size].tobytes())
            statuses.add(status)
            exponents, start = exponents[size:], start + length
        assert coder == "zstd" or statuses == {SUPPORTED}, coder


def test_the_gpu_decoder_reads_fse_coded_weights_rle_and_raw_frames(encoder, gpu_decode):
    squares = (np.random.default_rng(12).standard_normal(1 << 18) * 1e-4) ** 2
    planes = [to_planes(memoryview(squares.astype(np.float32).tobytes()), ElementKind.FP32)[3],
              np.zeros(FRAME + 7, dtype=np.uint8),
              np.random.default_rng(13).integers(0, 256, 5000, dtype=np.uint8)]
    for plane in planes:
        for frame, size in zip(encoder(plane), frame_sizes(len(plane)), strict=True):
            assert gpu_decode(frame, size) == (SUPPORTED, plane[:size].tobytes())
            plane = plane[size:]


def test_frames_of_other_shapes_are_left_to_nvcomp_and_damage_is_reported(encoder, gpu_decode):
    text = b"checkpoint shards repeat themselves; " * 4000
    several_blocks = zstandard.ZstdCompressor(level=3).compress(text)
    with_sequences = zstandard.ZstdCompressor(level=3).compress(text[:5000])
    assert gpu_decode(several_blocks, len(text))[0] == UNSUPPORTED
    assert gpu_decode(with_sequences, 5000)[0] == UNSUPPORTED
    exponents = to_planes(memoryview(float_values(ElementKind.BF16, FRAME, seed=14)), ElementKind.BF16)[0]
    ours = encoder(exponents)  # one frame, Huffman-coded
    assert gpu_decode(ours[0][:-1], FRAME)[0] == DAMAGED  # truncated
    assert gpu_decode(ours[0], FRAME + 1)[0] == DAMAGED  # not the size the chunk's table says
