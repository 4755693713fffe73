"""Codec layer: exact round trips of the float byte-plane transform and clear errors on damage."""

from __future__ import annotations

import io
import logging
import random
import struct

import numpy as np
import pytest
import zstandard as zstd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvfs.codec import (
    Codec,
    CodecError,
    CpuEngine,
    ElementKind,
    Encoded,
    Region,
    Transform,
    cpu_decodes,
    make_engine,
)
from nvfs.codec import planes as plane_module
from nvfs.codec.base import ITEM_SIZE
from nvfs.codec.planes import (
    FRAME_SIZE,
    PlaneEntry,
    RegionEntry,
    from_planes,
    pack_params,
    parse_params,
    to_planes,
)
from nvfs.formats import LayoutTracker
from nvfs.store.chunk import CHUNK_HASHES, ChunkCorrupt, decode_chunk, encode_chunk

pytestmark = pytest.mark.unit

ENGINE = CpuEngine(level=3)
FLOAT_DTYPES = {ElementKind.FP16: np.float16, ElementKind.FP32: np.float32, ElementKind.FP64: np.float64}
SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-310, 65504.0, 1e-8]


def _values(kind: ElementKind, count: int, seed: int, zero_fraction: float, specials: bool) -> bytes:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(count) * 10.0 ** rng.integers(-6, 3)
    values[rng.random(count) < zero_fraction] = 0.0
    if specials and count:
        values[rng.integers(0, count, size=min(count, 20))] = rng.choice(SPECIALS, size=min(count, 20))
    if kind == ElementKind.BF16:
        as32 = values.astype(np.float32).view(np.uint32)
        return (as32 >> 16).astype(np.uint16).tobytes()
    with np.errstate(over="ignore"):
        return values.astype(FLOAT_DTYPES[kind]).tobytes()


@pytest.fixture(params=["c", "numpy"])
def plane_loops(request, monkeypatch):
    """Each test of the plane loops runs with the C extension and with numpy's version."""
    if request.param == "numpy":
        monkeypatch.setattr(plane_module, "native", None)
    return request.param


@pytest.fixture(params=["huffman", "zstd"])
def plane_coders(request, monkeypatch):
    """Float planes coded by nvfs.codec._huffman (zstd too where it may be smaller), and by zstd alone."""
    if request.param == "zstd":
        monkeypatch.setattr(plane_module, "huffman", None)
    return request.param


def test_the_c_plane_loops_are_built():
    """setup.py builds nvfs.codec._planes where there is a compiler (scripts/setup.sh installs gcc):
    without it every chunk is cut and merged by numpy, merging five to six times slower."""
    assert plane_module.native is not None, "nvfs.codec._planes is missing: pip install -e . with gcc"


@pytest.mark.parametrize("kind", [ElementKind.BF16, ElementKind.FP16, ElementKind.FP32, ElementKind.FP64])
def test_planes_are_the_bytes_of_the_values_rotated_left_one_bit(kind, plane_loops):
    """docs/FORMAT.md's definition, computed value by value in Python; merged back exactly."""
    size = ITEM_SIZE[kind]
    data = np.random.default_rng(5).integers(0, 256, 1000 * size, dtype=np.uint8).tobytes()
    bits = 8 * size
    expected = [bytearray() for _ in range(size)]
    for start in range(0, len(data), size):
        value = int.from_bytes(data[start : start + size], "little")
        rotated = ((value << 1) | (value >> (bits - 1))) & ((1 << bits) - 1)
        for index in range(size):
            expected[index].append((rotated >> (8 * (size - 1 - index))) & 0xFF)
    planes = to_planes(memoryview(data), kind)
    assert [plane.tobytes() for plane in planes] == list(map(bytes, expected))
    out = bytearray(len(data))
    from_planes([bytes(plane) for plane in expected], kind, memoryview(out))
    assert bytes(out) == data


@given(st.binary(max_size=4096), st.sampled_from([2, 4, 8]), st.integers(0, 7), st.data())
@settings(max_examples=200, deadline=None)
def test_c_and_numpy_plane_loops_agree_on_any_values(data, size, offset, draw):
    """Any bytes, including values that start off their natural alignment in the buffer, and
    any run of planes (one alone, the rest of them in one pass, or between)."""
    data = data[: len(data) - len(data) % size]
    values = np.frombuffer(bytes(offset) + data, dtype=np.uint8)[offset:]
    kind = {2: ElementKind.BF16, 4: ElementKind.FP32, 8: ElementKind.FP64}[size]
    native = plane_module.native
    assert native is not None
    expected = to_planes_numpy(data, kind)
    first = draw.draw(st.integers(0, size - 1))
    last = draw.draw(st.integers(first, size - 1))
    out = np.empty(len(data) // size * (last - first + 1), dtype=np.uint8)
    native.cut_planes(values, size, first, last, out)
    assert out.tobytes() == b"".join(expected[first : last + 1])
    merged = bytearray(len(data))
    native.merge_planes(expected, size, merged)
    assert bytes(merged) == data


@pytest.mark.parametrize("coded", [(0, 1), (0, 2), (0, 1, 2, 3), (3,)], ids=str)
def test_raw_planes_after_a_coded_one_move_down_to_close_the_gap(coded, plane_loops):
    """The planes after the exponent are cut where they stay when raw; a coded one shifts the rest."""
    count = 3 * 65536
    rng = np.random.default_rng(11)
    planes = [rng.integers(0, 256, count, dtype=np.uint8) for _ in range(4)]
    for index in coded:  # few distinct bytes: these planes shrink
        planes[index] = rng.integers(120, 124, count, dtype=np.uint8)
    rotated = sum(planes[index].astype(np.uint32) << (8 * (3 - index)) for index in range(4))
    data = ((rotated >> 1) | (rotated << 31)).astype(np.uint32).tobytes()
    encoded = ENGINE.encode(data, [Region(len(data), ElementKind.FP32)])
    (region,) = parse_params(encoded.params, len(data), len(encoded.payload))
    assert [plane.codec != Codec.RAW for plane in region.planes] == [index in coded for index in range(4)]
    assert bytes(ENGINE.decode(encoded, len(data))) == data


def to_planes_numpy(data: bytes, kind: ElementKind) -> list[bytes]:
    saved, plane_module.native = plane_module.native, None
    try:
        return [plane.tobytes() for plane in to_planes(memoryview(data), kind)]
    finally:
        plane_module.native = saved


@pytest.mark.parametrize("coded_by", ["c", "numpy"])
def test_a_chunk_coded_by_one_plane_implementation_decodes_with_the_other(coded_by, monkeypatch):
    """A store written where the extension is built reads where it is not, and back."""
    native = plane_module.native
    regions = [Region(3 * 65536, ElementKind.BF16), Region(4 * 65536, ElementKind.FP32),
               Region(8 * 8192, ElementKind.FP64), Region(1000, ElementKind.BYTES)]
    data = b"".join(_values(region.kind, region.length // ITEM_SIZE[region.kind], seed, 0.2, True)
                    if region.kind != ElementKind.BYTES else bytes(range(250)) * 4
                    for seed, region in enumerate(regions))
    monkeypatch.setattr(plane_module, "native", native if coded_by == "c" else None)
    encoded = ENGINE.encode(data, regions)
    assert encoded.transform == Transform.PLANES
    monkeypatch.setattr(plane_module, "native", None if coded_by == "c" else native)
    assert bytes(ENGINE.decode(encoded, len(data))) == data


def test_the_c_plane_loops_refuse_what_does_not_fit():
    native = plane_module.native
    assert native is not None
    values = np.zeros(16, dtype=np.uint8)
    with pytest.raises(ValueError, match="no byte planes"):
        native.cut_planes(values, 3, 0, 0, np.empty(5, dtype=np.uint8))
    with pytest.raises(ValueError, match="planes 4 to 4 of 4-byte values"):
        native.cut_planes(values, 4, 4, 4, np.empty(4, dtype=np.uint8))
    with pytest.raises(ValueError, match="planes 2 to 1 of 4-byte values"):
        native.cut_planes(values, 4, 2, 1, np.empty(4, dtype=np.uint8))
    with pytest.raises(ValueError, match="16 bytes of values for 1 planes in 3 bytes"):
        native.cut_planes(values, 4, 0, 0, np.empty(3, dtype=np.uint8))
    with pytest.raises(ValueError, match="16 bytes of values for 3 planes in 8 bytes"):
        native.cut_planes(values, 4, 1, 3, np.empty(8, dtype=np.uint8))
    with pytest.raises(ValueError, match="3 planes for 4-byte values"):
        native.merge_planes([b"ab"] * 3, 4, bytearray(8))
    with pytest.raises(ValueError, match="plane 1 holds 1 bytes, expected 2"):
        native.merge_planes([b"ab", b"a", b"ab", b"ab"], 4, bytearray(8))
    with pytest.raises(TypeError):
        native.merge_planes([b"ab"] * 4, 4, b"read-only")


def _roundtrip(data: bytes, regions: list[Region] | None) -> None:
    encoded = ENGINE.encode(data, regions)
    assert bytes(ENGINE.decode(encoded, len(data))) == data
    out = memoryview(bytearray(b"\xa5" * len(data)))  # not zeros: every byte must be written
    decoded = ENGINE.decode(encoded, len(data), out)
    assert bytes(decoded) == data
    assert (decoded is out) == (encoded.transform == Transform.PLANES)


def test_float_chunks_decode_into_the_buffer_given():
    data = _values(ElementKind.FP32, 1 << 18, seed=5, zero_fraction=0.0, specials=False)
    digest = CHUNK_HASHES["blake3"](data)
    parts, _ = encode_chunk(data, ENGINE, [Region(len(data), ElementKind.FP32)], digest)
    blob = b"".join(bytes(part) for part in parts)
    out = memoryview(bytearray(len(data)))
    assert decode_chunk(blob, ENGINE, digest.hex(), CHUNK_HASHES["blake3"], len(data), out=out) is out
    assert bytes(out) == data
    longer = memoryview(bytearray(len(data) + 1))  # not the chunk's length: decoded elsewhere
    assert bytes(decode_chunk(blob, ENGINE, digest.hex(), CHUNK_HASHES["blake3"], out=longer)) == data


region_kinds = st.sampled_from(list(ElementKind))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parts=st.lists(st.tuples(region_kinds, st.integers(0, 40_000), st.floats(0, 1), st.booleans()),
                   min_size=1, max_size=5),
    seed=st.integers(0, 2**32 - 1),
)
def test_regions_roundtrip_bit_exact(parts, seed):
    """Any mix of regions, sizes, zero runs, NaN/Inf and subnormals decodes to the same bits."""
    blobs, regions = [], []
    for index, (kind, count, zero_fraction, specials) in enumerate(parts):
        if kind == ElementKind.BYTES:
            blob = np.random.default_rng(seed + index).integers(0, 4, count, dtype=np.uint8).tobytes()
        else:
            blob = _values(kind, count // ITEM_SIZE[kind], seed + index, zero_fraction, specials)
        blobs.append(blob)
        regions.append(Region(len(blob), kind))
    data = b"".join(blobs)
    _roundtrip(data, [region for region in regions if region.length] or [Region(0, ElementKind.BYTES)])
    _roundtrip(data, None)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from([ElementKind.BF16, ElementKind.FP32]), cut=st.integers(0, 7),
       chunk=st.integers(1, 300_000), seed=st.integers(0, 1000))
def test_chunk_boundaries_inside_values(kind, cut, chunk, seed):
    """Chunks cut anywhere (inside a value too) still round-trip through the layout tracker."""
    values = _values(kind, 200_000, seed, 0.1, True)
    prefix = bytes(cut)
    header = struct.pack("<Q", 0)  # no format: the tracker answers None, the engine guesses
    data = header + prefix + values
    tracker = LayoutTracker()
    for offset in range(0, len(data), chunk):
        piece = data[offset : offset + chunk]
        _roundtrip(piece, tracker.chunk_regions(offset, piece))


def test_the_huffman_coder_is_built():
    """setup.py builds nvfs.codec._huffman where there is a C++ compiler (scripts/setup.sh installs
    g++): without it zstd codes the exponent planes, searching for matches they do not have."""
    assert plane_module.huffman is not None, "nvfs.codec._huffman is missing: pip install -e . with g++"


def test_zeros_cost_almost_nothing(plane_coders):
    data = bytes(4 << 20)
    encoded = ENGINE.encode(data, [Region(len(data), ElementKind.FP32)])
    assert len(encoded.payload) + len(encoded.params) < 4096


def test_float_planes_beat_plain_zstd_on_weights():
    rng = np.random.default_rng(0)
    weights = (rng.standard_normal(1 << 20) * 0.02).astype(np.float32).tobytes()
    planes = ENGINE.encode(weights, [Region(len(weights), ElementKind.FP32)])
    plain = ENGINE.encode(weights, [Region(len(weights), ElementKind.BYTES)])
    assert planes.transform == Transform.PLANES
    assert len(planes.payload) < 0.95 * len(plain.payload)


def test_float_planes_are_standard_zstd_frames_one_per_sub_block(plane_coders):
    """Each frame decodes alone with any zstd (the portable format), to its sub-block of the plane."""
    rng = np.random.default_rng(4)
    weights = (rng.standard_normal(1 << 19) * 0.02).astype(np.float32).tobytes()
    encoded = ENGINE.encode(weights, [Region(len(weights), ElementKind.FP32)])
    (region,) = parse_params(encoded.params, len(weights), len(encoded.payload))
    expected = to_planes(memoryview(weights), ElementKind.FP32)
    framed, start = 0, 0
    for plane, plane_bytes in zip(region.planes, expected, strict=True):
        if plane.codec == Codec.ZSTD_FRAMES:
            framed += 1
            assert len(plane.frame_lengths) == -(-len(plane_bytes) // FRAME_SIZE)
            for index, stored in enumerate(plane.frame_lengths):
                frame = bytes(encoded.payload[start : start + stored])
                sub_block = plane_bytes[index * FRAME_SIZE : (index + 1) * FRAME_SIZE].tobytes()
                assert zstd.ZstdDecompressor().decompress(frame, max_output_size=FRAME_SIZE) == sub_block
                start += stored
        else:
            start += plane.stored
    assert framed >= 1, "the exponent plane should be coded"


def huffman_frames(plane: np.ndarray, frame_size: int = FRAME_SIZE) -> list[bytes] | None:
    frames = -(-len(plane) // frame_size)
    out = np.empty(len(plane) + 16 * frames, dtype=np.uint8)
    lengths = plane_module.huffman.encode_frames(plane, frame_size, out)
    if lengths is None:
        return None
    ends = np.cumsum([0, *lengths])
    return [out[start:end].tobytes() for start, end in zip(ends[:-1], ends[1:], strict=True)]


def test_huffman_frames_of_rare_values_are_stored_raw_not_overrun():
    """Codes come from the whole plane's table: a frame of values rare in the plane takes up to
    11 bits a byte. Such a frame is stored raw, and coding it first must fit its scratch."""
    rng = np.random.default_rng(21)
    common = rng.geometric(0.4, 7 * FRAME_SIZE).clip(1, 6).astype(np.uint8)
    rare = np.tile(np.arange(7, 256, dtype=np.uint8), FRAME_SIZE // 249 + 1)[:FRAME_SIZE]
    plane = np.concatenate([common, rare])
    frames = huffman_frames(plane)
    assert b"".join(zstd.ZstdDecompressor().decompress(frame) for frame in frames) == plane.tobytes()
    assert len(frames[-1]) == 12 + FRAME_SIZE  # frame header and block header, then the bytes
    assert all(len(frame) < FRAME_SIZE // 2 for frame in frames[:-1])


def test_huffman_leaves_one_valued_planes_to_zstd_and_keeps_zstd_where_it_is_smaller(plane_coders):
    coder = plane_module.PlaneCoder(3)
    sevens = np.full(3 * FRAME_SIZE, 7, dtype=np.uint8)
    if plane_coders == "huffman":
        assert huffman_frames(sevens) is None  # no table for one value
    entry, packed = coder.compress_float_plane(sevens)
    assert entry.codec == Codec.ZSTD_FRAMES and entry.stored < 100
    # Runs of zeros with a few other values: Huffman spends a bit per byte, zstd's matches less.
    runs = np.zeros(4 * FRAME_SIZE, dtype=np.uint8)
    runs[::97] = np.random.default_rng(22).integers(1, 40, len(runs[::97]))
    entry, packed = coder.compress_float_plane(runs)
    assert entry.stored < len(runs) // 10
    decoded = coder.decompress(entry, memoryview(bytes(packed)), len(runs))
    assert bytes(decoded) == runs.tobytes()


def test_huffman_coder_refuses_what_does_not_fit():
    plane = np.random.default_rng(23).integers(0, 9, 3 * FRAME_SIZE, dtype=np.uint8)
    with pytest.raises(ValueError, match="out holds"):
        plane_module.huffman.encode_frames(plane, FRAME_SIZE, np.empty(len(plane), dtype=np.uint8))
    for frame_size in (0, FRAME_SIZE + 1):
        with pytest.raises(ValueError, match="frame_size"):
            plane_module.huffman.encode_frames(plane, frame_size, np.empty(2 * len(plane), dtype=np.uint8))


def test_detection_picks_the_float_kind():
    rng = np.random.default_rng(1)
    weights = (rng.standard_normal(1 << 20) * 0.02).astype(np.float32).tobytes()
    assert ENGINE.encode(weights).transform == Transform.PLANES


@pytest.mark.parametrize("hash_name", sorted(CHUNK_HASHES))
@pytest.mark.parametrize("damage", ["payload", "params", "truncate", "header"])
def test_damaged_chunk_is_reported_not_returned(damage, hash_name):
    rng = np.random.default_rng(2)
    data = (rng.standard_normal(300_000) * 0.02).astype(np.float32).tobytes()
    digest_of = CHUNK_HASHES[hash_name]
    parts, encoded = encode_chunk(data, ENGINE, [Region(len(data), ElementKind.FP32)], digest_of(data))
    blob = b"".join(parts)
    chunk_id = digest_of(data).hex()
    broken = bytearray(blob)
    if damage == "payload":
        broken[-100] ^= 0x40
    elif damage == "params":
        broken[64 + 5] ^= 0x01
    elif damage == "truncate":
        del broken[-10:]
    else:
        broken[5] = 99  # unknown codec
    with pytest.raises(ChunkCorrupt):
        decode_chunk(bytes(broken), ENGINE, chunk_id, digest_of)
    assert bytes(decode_chunk(blob, ENGINE, chunk_id, digest_of)) == data


def test_regions_must_cover_the_chunk():
    with pytest.raises(CodecError):
        ENGINE.encode(bytes(100), [Region(50, ElementKind.FP32)])


def _kinds_found(blob: bytes, chunk: int) -> dict[str, int]:
    tracker, found = LayoutTracker(), {}
    for offset in range(0, len(blob), chunk):
        piece = blob[offset : offset + chunk]
        regions = tracker.chunk_regions(offset, piece)
        assert regions is not None, f"layout unknown at {offset}"
        _roundtrip(piece, regions)
        for region in regions:
            found[region.kind.name] = found.get(region.kind.name, 0) + region.length
    return found


@pytest.mark.parametrize("chunk", [1 << 22, 65536, 4099])
def test_layout_of_torch_save_and_safetensors(chunk):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save

    state = {"w": torch.randn(3000).to(torch.bfloat16), "m": torch.randn(100, 100),
             "h": torch.randn(777).half(), "ids": torch.arange(500), "d": torch.randn(64).double()}
    expected = {"BF16": 6000, "FP32": 40000, "FP16": 1554, "FP64": 512}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    for blob in (buffer.getvalue(), save(state)):
        found = _kinds_found(blob, chunk)
        for kind, size in expected.items():
            assert found.get(kind, 0) >= size - 2 * 8 * (len(blob) // chunk + 1), (kind, found)
            assert found.get(kind, 0) <= size


def test_regions_among_many_spans():
    """Each chunk of a file with a thousand tensors gets exactly the values of the spans it cuts."""
    from nvfs.formats.stream import Span
    from nvfs.formats.tracker import span_regions

    rng, spans, position = random.Random(6), [], 64
    for index in range(1000):
        kind = (ElementKind.FP32, ElementKind.BF16)[index % 2]
        length = rng.randrange(300 << 10, 600 << 10, 4)  # large: regions are not merged
        spans.append(Span(position, position + length, kind))
        position += length + rng.randrange(0, 256, 4)
    chunk = 4 << 20
    for start in range(0, position, chunk):
        end = min(start + chunk, position)
        regions, cursor = span_regions(spans, start, end), start
        assert sum(region.length for region in regions) == end - start
        for region in regions:
            if region.kind != ElementKind.BYTES:
                assert any(span.kind == region.kind and span.start <= cursor
                           and cursor + region.length <= span.end for span in spans)
            cursor += region.length
        expected = sum(min(span.end, end) - max(span.start, start) for span in spans
                       if span.start < end and span.end > start)
        found = sum(region.length for region in regions if region.kind != ElementKind.BYTES)
        assert expected - 8 <= found <= expected  # a value cut by a chunk boundary is coded as bytes


def test_pickle_is_read_without_running_code(tmp_path):
    """A torch file whose pickle would run code if loaded: the tracker only records storages."""
    torch = pytest.importorskip("torch")
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    buffer = io.BytesIO()
    torch.save({"t": torch.randn(1000), "evil": Evil()}, buffer)
    found = _kinds_found(buffer.getvalue(), 1 << 22)
    assert found["FP32"] == 4000
    assert not marker.exists()


def test_layout_of_a_distributed_checkpoint_shard(tmp_path):
    """torch.distributed.checkpoint shards are torch.save archives back to back."""
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    state = {f"w{i}": torch.randn(64, 64) for i in range(20)}
    with pytest.warns(UserWarning):  # no process group: torch says it assumes one process
        dcp.save(state, checkpoint_id=str(tmp_path))
    shard = next(tmp_path.glob("*.distcp")).read_bytes()
    found = _kinds_found(shard, 65536)
    assert found["FP32"] >= 0.99 * 20 * 64 * 64 * 4  # values cut by a chunk boundary stay bytes


def test_cpu_engine_refuses_ans_planes_clearly():
    """ANS planes (``-o codec=ans``, written by the GPU engine) have no CPU decoder: a clear error."""
    plane = bytes(range(64)) * (3 * FRAME_SIZE // 64 + 3)
    frames = [zstd.ZstdCompressor().compress(plane[start : start + FRAME_SIZE])
              for start in range(0, len(plane), FRAME_SIZE)]
    for codec in (Codec.ZSTD_FRAMES, Codec.ANS):
        entry = PlaneEntry(codec, sum(map(len, frames)), FRAME_SIZE, tuple(map(len, frames)))
        params = pack_params([RegionEntry(ElementKind.BYTES, len(plane), (entry,))])
        encoded = Encoded(codec, Transform.PLANES, params, b"".join(frames))
        if codec == Codec.ZSTD_FRAMES:
            assert CpuEngine().decode(encoded, len(plane)) == plane
        else:
            with pytest.raises(CodecError, match="ANS.*GPU engine"):
                CpuEngine().decode(encoded, len(plane))


def test_chunk_crc_guards_engines_that_cannot_reject_damage():
    """Engines whose decoders may fault on damaged bytes (the GPU's) only see CRC-checked chunks."""

    class CpuEngineTrustingItsInput(CpuEngine):
        rejects_damaged_input = False

    data = np.random.default_rng(3).standard_normal(1 << 18).astype(np.float32).tobytes()
    engine = CpuEngineTrustingItsInput()
    digest_of = CHUNK_HASHES["blake3"]
    blob = b"".join(encode_chunk(data, engine, [Region(len(data), ElementKind.FP32)], digest_of(data))[0])
    chunk_id = digest_of(data).hex()
    assert decode_chunk(blob, engine, chunk_id, digest_of) == data
    damaged = bytearray(blob)
    damaged[-100] ^= 0x40
    with pytest.raises(ChunkCorrupt, match="CRC"):
        decode_chunk(bytes(damaged), engine, chunk_id, digest_of)


def test_engine_auto_falls_back_to_the_cpu_with_a_reason(caplog):
    """Without CUDA, CuPy or nvCOMP, engine=auto is the CPU engine and the log says why."""
    caplog.set_level(logging.INFO, logger="nvfs.codec")
    engine = make_engine("auto", 3)
    if engine.name == "gpu":
        pytest.skip("this machine has a usable GPU engine")
    assert isinstance(engine, CpuEngine)
    assert any("using the CPU engine (" in record.getMessage() for record in caplog.records)
    with pytest.raises(CodecError, match="engine=gpu"):
        make_engine("gpu", 3)


def test_the_cpu_decodes_every_encoding_but_ans():
    """What fetch processes (CPU only) may be sent: every encoding a CPU or GPU writer makes, but ANS."""
    names = ("raw", "zstd", "planes+raw", "planes+zstd", "planes+zstd_frames")
    assert all(cpu_decodes(name) for name in names)
    assert not cpu_decodes("planes+ans")
