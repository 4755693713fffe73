"""Real checkpoint formats through a real mount: torch.save/torch.load and safetensors."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.fuse

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
from safetensors import safe_open  # noqa: E402

from nvfs.store import DEFAULT_CHUNK_SIZE  # noqa: E402


def _trained_state() -> dict:
    """A small model after a few AdamW steps: weights, master copy and optimizer moments."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(5):
        x = torch.randn(32, 256)
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {
        "model_bf16": {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()},
        "master": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": 5,
    }


def _assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        assert a == b


@pytest.mark.smoke
def test_torch_save_and_load_across_remount(mounted):
    state = _trained_state()
    path = mounted.path / "ckpt" / "step_5.pt"
    path.parent.mkdir()
    torch.save(state, path)
    _assert_same(state, torch.load(path))
    mounted.remount()
    _assert_same(state, torch.load(path, mmap=True))


def test_safetensors_save_load_mmap_and_safe_open(mounted):
    torch.manual_seed(1)
    tensors = {
        "embed": torch.randn(1000, 64).to(torch.bfloat16),
        "proj": torch.randn(300, 300),
        "zeros": torch.zeros(512, 512),
        "ids": torch.arange(10_000, dtype=torch.int64),
    }
    path = str(mounted.path / "model.safetensors")
    safetensors_torch.save_file(tensors, path)
    mounted.remount()
    _assert_same(tensors, safetensors_torch.load_file(path))
    with safe_open(path, framework="pt") as f:
        assert torch.equal(f.get_tensor("proj"), tensors["proj"])
        assert torch.equal(f.get_slice("ids")[5:10], tensors["ids"][5:10])


def test_compressible_checkpoint_is_stored_smaller(mounted):
    torch.manual_seed(2)
    weights = {f"layer{i}": torch.randn(512, 512).to(torch.bfloat16) for i in range(8)}
    weights["frozen_rows"] = torch.zeros(4096, 256)
    path = mounted.path / "weights.pt"
    torch.save(weights, path)
    logical = os.path.getsize(path)
    stored = int(os.getxattr(path, "user.nvfs.stored_size"))
    assert stored < 0.8 * logical, (stored, logical)
    chunk_keys = mounted.keys("chunks/")
    assert chunk_keys
    store_bytes = sum(len(mounted.read_object(key)) for key in chunk_keys)
    assert store_bytes < 0.8 * logical


def _expected_stored(blob: bytes, chunk: int = DEFAULT_CHUNK_SIZE) -> int:
    """What the codec layer stores for ``blob`` when it sees the file's chunks in order."""
    from nvfs.codec import CpuEngine
    from nvfs.formats import LayoutTracker
    from nvfs.store.chunk import HEADER

    engine, tracker, total = CpuEngine(level=3), LayoutTracker(), 0
    for offset in range(0, len(blob), chunk):
        piece = blob[offset : offset + chunk]
        encoded = engine.encode(piece, tracker.chunk_regions(offset, piece))
        total += HEADER.size + len(encoded.params) + len(encoded.payload)
    return total


def test_float_aware_ratio_end_to_end(mounted):
    """torch.save and safetensors files written through the mount get the codec's full ratio."""
    torch.manual_seed(3)
    weights = {f"layer{i}.weight": (torch.randn(1024, 1024) * 0.02) for i in range(6)}
    optimizer = {f"exp_avg_sq.{i}": (torch.randn(512, 1024) * 1e-4) ** 2 for i in range(4)}
    files = {
        "mixed.pt": lambda path: torch.save({"bf16": {k: v.to(torch.bfloat16) for k, v in weights.items()},
                                             "master": weights, "adam": optimizer}, path),
        "weights.safetensors": lambda path: safetensors_torch.save_file(
            {k: v.to(torch.bfloat16) for k, v in weights.items()}, path),
    }
    for name, save in files.items():
        path = mounted.path / name
        save(str(path))
        stored = int(os.getxattr(path, "user.nvfs.stored_size"))
        expected = _expected_stored(path.read_bytes())
        assert stored <= 1.01 * expected, (name, stored, expected)
        assert "planes" in os.getxattr(path, "user.nvfs.codec").decode()
    ratio = float(os.getxattr(mounted.path / "weights.safetensors", "user.nvfs.ratio"))
    assert ratio > 1.45  # bf16 weights: order-0 bound ~1.5x, plain zstd ~1.28x
