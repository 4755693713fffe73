"""The GPU engine (nvCOMP through CuPy): round trips, interop with the CPU engine, a whole mount.

Marked ``gpu``: they run on the GPU machine (``benchmarks/gpu_setup.sh`` prepares it) and are
skipped, with the reason shown, where CUDA, CuPy or nvCOMP is not usable.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from nvfs.codec import Codec, CodecError, CpuEngine, ElementKind, Region, Transform, make_engine
from nvfs.codec.base import ITEM_SIZE
from nvfs.codec.planes import parse_params
from nvfs.store.chunk import CHUNK_HASHES, HEADER, ChunkCorrupt, decode_chunk, encode_chunk
from nvfs.testing.procfs import cpu_seconds
from tests.conftest import MIB, checkpoint_like, drop_cache, fetch_children

pytestmark = pytest.mark.gpu
KINDS = (ElementKind.BYTES, ElementKind.BF16, ElementKind.FP16, ElementKind.FP32, ElementKind.FP64)
_DTYPE = {ElementKind.BF16: np.float32, ElementKind.FP16: np.float16, ElementKind.FP32: np.float32,
          ElementKind.FP64: np.float64}


def _engine(codec: str):
    try:
        return make_engine("gpu", 3, codec=codec)
    except CodecError as exc:
        pytest.skip(f"no usable GPU engine: {exc}")


@pytest.fixture(scope="module")
def gpu():
    engine = _engine("portable")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def gpu_ans():
    engine = _engine("ans")
    yield engine
    engine.close()


def float_bytes(kind: ElementKind, count: int, seed: int, scale: float = 0.02) -> bytes:
    """Values shaped like weights: normal, some exact zeros, the odd NaN, Inf and subnormal."""
    rng = np.random.default_rng(seed)
    if kind == ElementKind.BYTES:
        return rng.integers(0, 16, count, dtype=np.uint8).tobytes()
    values = (rng.standard_normal(count) * scale).astype(_DTYPE[kind])
    values[rng.random(count) < 0.05] = 0
    values[:4] = [np.nan, np.inf, -np.inf, np.finfo(_DTYPE[kind]).tiny / 2]
    if kind == ElementKind.BF16:  # the top half of each fp32 value is a bf16 value
        return (values.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return values.tobytes()


def mixed_chunk(seed: int) -> tuple[bytes, list[Region]]:
    """Regions of every kind, of uneven lengths, plus random bytes and a run of zeros."""
    parts, regions = [], []
    for index, kind in enumerate(KINDS):
        data = float_bytes(kind, 40_000 + 3 * index + seed, seed + index)
        parts.append(data)
        regions.append(Region(len(data), kind))
    noise = np.random.default_rng(seed).bytes(70_001)
    parts += [noise, bytes(200_000)]
    regions += [Region(len(noise), ElementKind.BYTES), Region(200_000, ElementKind.FP32)]
    return b"".join(parts), regions


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_every_kind_both_engines_read_it(gpu, kind):
    data = float_bytes(kind, (3 << 20) // ITEM_SIZE[kind] + 1, seed=kind)
    regions = [Region(len(data) - len(data) % ITEM_SIZE[kind], kind)]
    if len(data) % ITEM_SIZE[kind]:
        regions.append(Region(len(data) % ITEM_SIZE[kind], ElementKind.BYTES))
    encoded = gpu.encode(data, regions)
    assert gpu.decode(encoded, len(data)) == data
    assert CpuEngine().decode(encoded, len(data)) == data  # GPU-written chunks are portable


def test_mixed_regions_interop_both_ways(gpu):
    cpu = CpuEngine()
    for seed in range(3):
        data, regions = mixed_chunk(seed)
        from_gpu, from_cpu = gpu.encode(data, regions), cpu.encode(data, regions)
        assert from_gpu.transform == Transform.PLANES
        assert cpu.decode(from_gpu, len(data)) == data
        assert gpu.decode(from_cpu, len(data)) == data
        assert gpu.decode(from_gpu, len(data)) == data


def test_ratios_against_the_cpu_engine(gpu, gpu_ans):
    """Both GPU codecs code planes as well as the CPU engine (the portable format's Huffman-only
    frames reach what the CPU's zstd reaches on float planes, which is its Huffman stage)."""
    cpu = CpuEngine()
    for kind in (ElementKind.BF16, ElementKind.FP32):
        data = float_bytes(kind, (4 << 20) // ITEM_SIZE[kind], seed=7)
        regions = [Region(len(data), kind)]
        cpu_size = len(cpu.encode(data, regions).payload)
        portable, ans = (len(engine.encode(data, regions).payload) for engine in (gpu, gpu_ans))
        assert ans <= 1.02 * cpu_size, f"{kind.name}: ANS {ans} vs CPU {cpu_size} bytes"
        assert portable <= 1.01 * cpu_size, f"{kind.name}: portable {portable} vs CPU {cpu_size} bytes"


def test_detected_layout_and_incompressible_chunks(gpu):
    weights = float_bytes(ElementKind.BF16, 2 << 20, seed=3)
    encoded = gpu.encode(weights)  # no regions: detected, as the CPU engine does
    assert encoded.transform == Transform.PLANES and len(encoded.payload) < 0.8 * len(weights)
    noise = os.urandom(1 << 20)
    stored = gpu.encode(noise, [Region(len(noise), ElementKind.BYTES)])
    assert stored.codec == Codec.RAW and stored.payload == noise
    assert gpu.decode(stored, len(noise)) == noise


def test_concurrent_callers_are_batched_and_each_gets_its_own_chunk(gpu):
    chunks = [mixed_chunk(seed) for seed in range(24)]
    results: dict[int, bytes] = {}

    def work(index: int) -> None:
        data, regions = chunks[index]
        results[index] = gpu.decode(gpu.encode(data, regions), len(data))

    threads = [threading.Thread(target=work, args=(index,)) for index in range(len(chunks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(results[index] == chunks[index][0] for index in range(len(chunks)))


def test_damaged_chunk_is_refused_before_the_gpu_sees_it(gpu):
    """A damaged chunk object fails its CRC check; the engine goes on decoding good chunks."""
    good, regions = mixed_chunk(1)
    digest_of = CHUNK_HASHES["blake3"]
    blob = b"".join(encode_chunk(good, gpu, regions, digest_of(good))[0])
    chunk_id = digest_of(good).hex()
    damaged = bytearray(blob)
    damaged[HEADER.size + 200 : HEADER.size + 264] = bytes(64)
    with pytest.raises(ChunkCorrupt, match="CRC"):
        decode_chunk(bytes(damaged), gpu, chunk_id, digest_of)
    assert decode_chunk(blob, gpu, chunk_id, digest_of) == good


def test_ans_round_trip_and_cpu_refuses_it_clearly(gpu_ans):
    data, regions = mixed_chunk(5)
    encoded = gpu_ans.encode(data, regions)
    assert encoded.codec == Codec.ANS and encoded.name == "planes+ans"
    assert gpu_ans.decode(encoded, len(data)) == data
    with pytest.raises(CodecError, match="ANS.*GPU engine"):
        CpuEngine().decode(encoded, len(data))


def test_ans_frames_of_an_earlier_size_still_decode(gpu_ans, monkeypatch):
    """ANS chunks written with 128 KiB frames (nvfs before 512 KiB) decode on today's engine."""
    from nvfs.codec import gpu as gpu_module  # here: importing it needs cupy

    monkeypatch.setattr(gpu_module, "ANS_FRAME_SIZE", 128 << 10)
    earlier = _engine("ans")
    try:
        data = float_bytes(ElementKind.BF16, 3 << 20, seed=6)  # 6 MiB: planes of several frames
        encoded = earlier.encode(data, [Region(len(data), ElementKind.BF16)])
    finally:
        earlier.close()
    planes = [plane for region in parse_params(encoded.params, len(data), len(encoded.payload))
              for plane in region.planes if plane.codec == Codec.ANS]
    assert planes and {plane.frame_size for plane in planes} == {128 << 10}
    assert len(planes[0].frame_lengths) == 24
    assert gpu_ans.decode(encoded, len(data)) == data


def test_ans_through_the_c_api_is_the_bitstream_of_nvcomps_python_codec(gpu_ans):
    """The batched C API (nvcomp_ans) writes byte for byte what nvCOMP's Python Codec writes and
    decodes those frames back; a frame that does not decode to its size is counted."""
    cp = pytest.importorskip("cupy")
    from nvidia import nvcomp

    from nvfs.codec.device_tables import TableUploads, aligned  # here: importing them needs cupy
    from nvfs.codec.nvcomp_ans import AnsFrames

    stream = cp.cuda.Stream(non_blocking=True)
    frame = 512 << 10
    sizes = np.array([frame, frame, 200_000, 4096, 1])
    starts = np.concatenate(([0], np.cumsum(aligned(sizes))[:-1]))
    data = cp.asarray(np.frombuffer(float_bytes(ElementKind.BYTES, int(starts[-1] + sizes[-1]), seed=8),
                                    dtype=np.uint8))
    with stream:
        ans = AnsFrames(stream, TableUploads(stream), frame)
        output = cp.empty(len(sizes) * ans.capacity, dtype=cp.uint8)
        lengths = ans.encode(data, starts, sizes, output).get()
        python = nvcomp.Codec(algorithm="ANS", data_type="|u1", bitstream_kind=nvcomp.BitstreamKind.RAW,
                              uncomp_chunk_size=frame, cuda_stream=stream.ptr)
        theirs = cp.zeros_like(output)
        targets = (np.arange(len(sizes)) * ans.capacity).tolist()
        coded = python.encode(nvcomp.as_arrays(data, starts.tolist(), sizes.tolist(), stream.ptr),
                              out=nvcomp.as_arrays(theirs, targets, [ans.capacity] * len(sizes), stream.ptr))
        assert [int(length) for length in coded.buffer_sizes] == lengths.tolist()
        stream.synchronize()
        del coded, python  # the batch before its codec, the codec before its stream
        assert all(cp.array_equal(output[start : start + int(length)], theirs[start : start + int(length)])
                   for start, length in zip(targets, lengths, strict=True))
        decoded = cp.zeros_like(data)
        bad = ans.decode(output, np.arange(len(sizes)) * ans.capacity, lengths, decoded, starts, sizes)
        assert int(bad.get()[0]) == 0
        for start, size in zip(starts.tolist(), sizes.tolist(), strict=True):
            assert cp.array_equal(decoded[start : start + size], data[start : start + size])
        short = sizes.copy()
        short[1] -= 1  # frame 1 expected one byte shorter than it decodes to
        bad = ans.decode(output, np.arange(len(sizes)) * ans.capacity, lengths, decoded, starts, short)
        assert int(bad.get()[0]) == 1


def test_table_uploads_survive_the_ring_wrapping(gpu):
    """Tables sent through a small pinned ring, many times round, arrive intact and typed."""
    cp = pytest.importorskip("cupy")
    from nvfs.codec.device_tables import TableUploads  # here: importing it needs cupy

    stream = cp.cuda.Stream(non_blocking=True)
    uploads = TableUploads(stream, size=4096)
    rng = np.random.default_rng(7)
    sent, received = [], []
    with stream:
        for step in range(200):
            tables = (rng.integers(0, 1 << 40, 1 + step % 37),
                      rng.integers(0, 1 << 20, (3, 1 + step % 11)).astype(np.int32))
            sent.append(tables)
            received.append(uploads.upload(*tables))
        big = rng.integers(0, 255, 10_000).astype(np.uint8)  # larger than the ring: copied directly
        (big_device,) = uploads.upload(big)
    stream.synchronize()
    for tables, arrays in zip(sent, received, strict=True):
        for table, array in zip(tables, arrays, strict=True):
            assert array.dtype == table.dtype and array.shape == table.shape
            assert np.array_equal(array.get(), table)
    assert np.array_equal(big_device.get(), big)


@pytest.mark.fuse
def test_torch_save_and_load_of_gigabytes_through_a_gpu_mount(gpu, mount_factory):
    """A multi-GB mixed-precision state dict through the mount with engine=gpu, read back exactly."""
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(0)
    state = {}
    for layer in range(12):  # 12 x (64 MiB bf16 + 3 x 128 MiB fp32) = 5.25 GiB
        shape = (4096, 8192)
        weight = torch.randn(shape, generator=generator) * 0.02
        state[f"layer{layer}.weight"] = weight.to(torch.bfloat16)
        state[f"layer{layer}.master"] = weight
        state[f"layer{layer}.exp_avg"] = torch.randn(shape, generator=generator) * 1e-4
        state[f"layer{layer}.exp_avg_sq"] = (torch.randn(shape, generator=generator) * 1e-4) ** 2
    mount = mount_factory(options=("engine=gpu",))
    mount.mount()
    path = mount.path / "ckpt.pt"
    torch.save(state, path)
    assert os.getxattr(path, "user.nvfs.engine") == b"gpu"
    stored = int(os.getxattr(path, "user.nvfs.stored_size"))
    assert stored < 0.9 * path.stat().st_size
    mount.remount()
    loaded = torch.load(path, weights_only=True)
    assert loaded.keys() == state.keys()
    for name, tensor in state.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    mount.umount()


@pytest.mark.fuse
@pytest.mark.s3
def test_a_gpu_mount_on_s3_decodes_portable_chunks_in_fetch_processes(gpu_ans, mount_factory):
    """Fetch processes serve a GPU mount too: portable chunks decode there, ANS chunks in the daemon.

    Sent to a fetch process, an ANS chunk would come back as damaged (the CPU has no ANS
    decoder): read exactly, it was decoded by the GPU engine.
    """
    files = {"ans.bin": checkpoint_like(24 * MIB, 3), "portable.bin": checkpoint_like(64 * MIB, 4)}
    mount = mount_factory(options=("engine=gpu", "fetch_procs=2"), backend="s3")
    for name, codec in (("ans.bin", "ans"), ("portable.bin", "portable")):
        mount.mount(f"codec={codec}")
        (mount.path / name).write_bytes(files[name])
        assert ("ans" in os.getxattr(mount.path / name, "user.nvfs.codec").decode()) == (codec == "ans")
        mount.umount()
    mount.mount()
    children = fetch_children(mount.daemon_pid())
    assert len(children) == 2
    for name, data in files.items():
        drop_cache(mount.path / name)
        before = sum(cpu_seconds(pid) for pid in children)
        assert (mount.path / name).read_bytes() == data, name
        decoded_there = sum(cpu_seconds(pid) for pid in children) - before
        if name == "portable.bin":
            assert decoded_there > 0.02  # 64 MiB decoded: tens of milliseconds of their CPU
    mount.umount()
