"""A seeded mixed-precision training state, built in memory, for the scenarios to save and load.

It is built like a real one: bf16 model weights, fp32 master weights and AdamW ``exp_avg`` /
``exp_avg_sq`` produced by actually running a few AdamW steps on a random linear regression (so
the optimizer state has the structure of real moments, not i.i.d. noise). Embedding rows of
tokens never sampled keep all-zero optimizer state, as in real training.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness.files import fsync_path
from benchmarks.harness.units import human

# AdamW state bytes per parameter: bf16 weight + fp32 master + exp_avg + exp_avg_sq.
BYTES_PER_PARAM = 2 + 4 + 4 + 4
HIDDEN_CHOICES = (2048, 1024, 512, 256, 128)
MIN_LAYERS = 4


@dataclass(frozen=True)
class ModelShape:
    """A GPT-style decoder: tied embedding, ``layers`` blocks of ``12 * hidden**2`` weights."""

    hidden: int
    layers: int
    vocab: int

    def parameters(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every parameter, in the order a model's ``state_dict`` has them."""
        h = self.hidden
        yield "embed.weight", (self.vocab, h)
        for i in range(self.layers):
            p = f"layers.{i}."
            yield p + "ln1.weight", (h,)
            yield p + "ln1.bias", (h,)
            yield p + "attn.qkv.weight", (3 * h, h)
            yield p + "attn.proj.weight", (h, h)
            yield p + "ln2.weight", (h,)
            yield p + "ln2.bias", (h,)
            yield p + "mlp.fc.weight", (4 * h, h)
            yield p + "mlp.proj.weight", (h, 4 * h)
        yield "final_ln.weight", (h,)
        yield "final_ln.bias", (h,)


def choose_shape(size_bytes: int, hidden: int | None) -> ModelShape:
    """Fit a model to ``size_bytes`` of training state: ~70% in layers, the rest in the embedding.

    Without ``--hidden`` the largest hidden size that still fits ``MIN_LAYERS`` layers is
    taken, so small sizes still get several layers rather than one huge matrix.
    """
    params = size_bytes // BYTES_PER_PARAM
    if hidden is None:
        fits = [h for h in HIDDEN_CHOICES if 0.7 * params >= MIN_LAYERS * 12 * h * h]
        hidden = fits[0] if fits else HIDDEN_CHOICES[-1]
    layers = max(1, round(0.7 * params / (12 * hidden * hidden)))
    per_layer = 12 * hidden * hidden + 4 * hidden
    vocab = max(64, (params - layers * per_layer - 2 * hidden) // hidden // 64 * 64)
    return ModelShape(hidden, layers, vocab)


def fit_shape(size_bytes: int) -> ModelShape:
    """``choose_shape``, with the vocabulary grown so the state is at least ``size_bytes``."""
    shape = choose_shape(size_bytes, None)
    params = sum(math.prod(dims) for _, dims in shape.parameters())
    deficit = size_bytes - params * BYTES_PER_PARAM
    if deficit > 0:
        rows = -(-deficit // (BYTES_PER_PARAM * shape.hidden))
        shape = ModelShape(shape.hidden, shape.layers, shape.vocab + -(-rows // 64) * 64)
    return shape


def _init_master(shape: ModelShape, gen: torch.Generator) -> dict[str, torch.nn.Parameter]:
    """fp32 master weights: N(0, 0.02) matrices, LayerNorm weights 1 and biases 0 (GPT-2 init)."""
    master: dict[str, torch.nn.Parameter] = {}
    for name, dims in shape.parameters():
        if len(dims) == 2:
            value = torch.randn(dims, generator=gen) * 0.02
        else:
            value = torch.ones(dims) if name.endswith("weight") else torch.zeros(dims)
        master[name] = torch.nn.Parameter(value)
    return master


def _embedding_grad(vocab: int, hidden: int, gen: torch.Generator) -> torch.Tensor:
    """Embedding gradient of one large batch: Zipf token counts, zero rows for unused tokens.

    The last 2% of the vocabulary stands for reserved tokens that never occur, so their rows
    keep all-zero Adam state; the rest is sampled 16 times per row on average with Zipf
    frequencies, so a few rare tokens are missed too. A row hit ``c`` times gets the sum of
    ``c`` N(0, 1) vectors, drawn directly as ``sqrt(c) * N(0, 1)`` to stay cheap.
    """
    used = vocab - vocab // 50
    weights = 1.0 / torch.arange(1, used + 1, dtype=torch.float64)
    ids = torch.multinomial(weights, 16 * used, replacement=True, generator=gen)
    counts = torch.bincount(ids, minlength=vocab).to(torch.float32)
    return torch.randn(vocab, hidden, generator=gen) * counts.sqrt().unsqueeze(1)


def _regression_grad(weight: torch.Tensor, batch: int, gen: torch.Generator) -> torch.Tensor:
    """Gradient of ``0.5 * ||X W^T - Y||^2 / batch`` for random inputs X and targets Y."""
    out_dim, in_dim = weight.shape
    x = torch.randn(batch, in_dim, generator=gen)
    y = torch.randn(batch, out_dim, generator=gen) * 0.5
    residual = x @ weight.detach().T - y
    return residual.T @ x / batch


def _set_grads(master: dict[str, torch.nn.Parameter], vocab: int, gen: torch.Generator,
               batch: int) -> None:
    """One training step's gradients: regression for matrices, sparse rows for the embedding."""
    for name, param in master.items():
        if name == "embed.weight":
            param.grad = _embedding_grad(vocab, param.shape[1], gen)
        elif param.dim() == 2:
            param.grad = _regression_grad(param, batch, gen)
        else:
            param.grad = torch.randn(param.shape, generator=gen) * 0.1


def build_state(shape: ModelShape, seed: int, steps: int) -> dict[str, Any]:
    """Run ``steps`` AdamW steps (grad clipping at 1.0, as in LLM training) and return the state.

    Layout follows common mixed-precision trainers: bf16 ``model`` weights, fp32
    ``master_weights`` that the optimizer updates, the optimizer's ``state_dict`` and a little
    bookkeeping.
    """
    gen = torch.Generator().manual_seed(seed)
    master = _init_master(shape, gen)
    optimizer = torch.optim.AdamW(master.values(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=0.1, foreach=True)
    for _ in range(steps):
        _set_grads(master, shape.vocab, gen, batch=64)
        torch.nn.utils.clip_grad_norm_(master.values(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {
        "model": {name: p.detach().to(torch.bfloat16) for name, p in master.items()},
        "master_weights": {name: p.detach() for name, p in master.items()},
        "optimizer": optimizer.state_dict(),
        "iteration": steps,
        "args": {"hidden": shape.hidden, "layers": shape.layers, "vocab": shape.vocab, "seed": seed},
    }


def tensors(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a nested dict/list structure, with a dotted path, in a stable order."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from tensors(value, f"{prefix}.{i}" if prefix else str(i))


def zero_row_fraction(state: dict[str, Any]) -> float:
    """Share of embedding rows whose ``exp_avg_sq`` is all zero (tokens never seen)."""
    exp_avg_sq = state["optimizer"]["state"][0]["exp_avg_sq"]
    return float((exp_avg_sq == 0).all(dim=1).float().mean())



def verify(expected: dict[str, Any], actual: dict[str, Any]) -> None:
    """Raise if any tensor differs in name, dtype, shape or bits (wrong data is a bug)."""
    want, got = list(tensors(expected)), list(tensors(actual))
    if [name for name, _ in want] != [name for name, _ in got]:
        raise AssertionError("loaded checkpoint has different tensor names")
    for (name, a), (_, b) in zip(want, got, strict=True):
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            raise AssertionError(f"loaded tensor {name} differs from the saved one")


def state_bytes(state: dict[str, Any]) -> int:
    """Bytes of every tensor of the state."""
    return sum(t.numel() * t.element_size() for _, t in tensors(state))


def build_described(shape: ModelShape, seed: int, steps: int) -> dict[str, Any]:
    """:func:`build_state`, and a line saying what was built and how long that took."""
    started = time.perf_counter()
    state = build_state(shape, seed, steps)
    count = len(list(tensors(state)))
    print(f"state: {human(state_bytes(state))} in {count} tensors; hidden {shape.hidden}, "
          f"{shape.layers} layers, vocab {shape.vocab}, {steps} AdamW steps, "
          f"{zero_row_fraction(state):.1%} embedding rows with all-zero Adam state; "
          f"built in {time.perf_counter() - started:.1f} s", flush=True)
    return state


def timed_save(state: dict[str, Any], path: Path, fsync: bool) -> float:
    """Seconds for ``torch.save`` (which closes the file) and, if asked, an ``fsync`` after it."""
    start = time.perf_counter()
    torch.save(state, path)
    if fsync:
        fsync_path(path)
    return time.perf_counter() - start
