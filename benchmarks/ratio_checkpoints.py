"""The real checkpoints of :mod:`benchmarks.ratio`: a small transformer trained here, saved as trainers save.

A byte-level decoder-only transformer is trained with AdamW on Python's standard library
sources (seeded; no download), and its state is saved as ``torch.save`` of a mixed-precision
training state, as bf16 and fp32 safetensors, and with ``torch.distributed.checkpoint``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TrainConfig:
    """Model and optimizer shape; the defaults keep 300 steps within ~2 minutes on 2 cores."""

    width: int = 256
    layers: int = 6
    seq: int = 128
    batch: int = 4
    steps: int = 300
    lr: float = 1e-3
    weight_decay: float = 0.1
    seed: int = 0

    @property
    def heads(self) -> int:
        return max(1, self.width // 64)


QUICK = TrainConfig(width=64, layers=2, seq=64, batch=4, steps=20)


def stdlib_corpus() -> torch.Tensor:
    """Every ``*.py`` of the standard library (not site-packages), sorted, as one byte tensor.

    Real text that every Python machine has, so the run needs no download and is reproducible
    for a given Python version.
    """
    root = Path(os.path.dirname(os.__file__))
    paths = sorted(p for p in root.rglob("*.py")
                   if "site-packages" not in p.parts and "dist-packages" not in p.parts)
    data = b"\n".join(p.read_bytes() for p in paths if p.is_file())
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention and a 4x GELU MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        qkv = self.qkv(self.ln1(x)).view(batch, seq, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, width))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class ByteGPT(nn.Module):
    """Decoder-only language model over bytes (vocabulary 256), untied output head."""

    def __init__(self, config: TrainConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(256, config.width)
        self.pos = nn.Embedding(config.seq, config.width)
        self.blocks = nn.ModuleList(Block(config.width, config.heads) for _ in range(config.layers))
        self.ln = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, 256, bias=False)
        self._init_weights(config.layers)

    def _init_weights(self, layers: int) -> None:
        """GPT-2 init: N(0, 0.02) weights, residual projections scaled down, zero biases.

        PyTorch's default uniform init would give weights a different exponent histogram
        than the normal init real language models use.
        """
        for name, param in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(param)
            elif param.dim() == 1:
                nn.init.ones_(param)
            else:
                residual = name.endswith(("proj.weight", "out.weight"))
                nn.init.normal_(param, std=0.02 / math.sqrt(2 * layers) if residual else 0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.tok(tokens) + self.pos.weight[: tokens.shape[1]]
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(self.ln(hidden))


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW as LLM trainers set it up: no weight decay on biases and LayerNorm weights."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95), eps=1e-8)


def learning_rate(config: TrainConfig, step: int) -> float:
    """Linear warmup over 10% of the steps, then cosine decay to 10% of the peak."""
    warmup = max(1, config.steps // 10)
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, config.steps - warmup)
    return config.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def sample_batch(corpus: torch.Tensor, config: TrainConfig, gen: torch.Generator) -> torch.Tensor:
    """``batch`` random windows of ``seq + 1`` bytes (inputs and shifted targets)."""
    starts = torch.randint(0, len(corpus) - config.seq - 1, (config.batch, 1), generator=gen)
    return corpus[starts + torch.arange(config.seq + 1)].long()


def train(config: TrainConfig, corpus: torch.Tensor) -> tuple[ByteGPT, torch.optim.AdamW, list[float]]:
    """Train with grad clipping at 1.0; returns the model, its optimizer and the losses (nats)."""
    torch.manual_seed(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    model = ByteGPT(config)
    optimizer = make_optimizer(model, config)
    losses: list[float] = []
    for step in range(config.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(config, step)
        window = sample_batch(corpus, config, gen)
        logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 256), window[:, 1:].reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return model, optimizer, losses


def mixed_state(model: nn.Module, optimizer: torch.optim.AdamW, config: TrainConfig,
                loss: float) -> dict[str, Any]:
    """The state a bf16 mixed-precision trainer saves: the bf16 weights are the fp32 masters cast."""
    return {
        "model": {name: p.detach().to(torch.bfloat16) for name, p in model.named_parameters()},
        "master_weights": {name: p.detach().clone() for name, p in model.named_parameters()},
        "optimizer": optimizer.state_dict(),
        "iteration": config.steps,
        "loss": loss,
        "config": asdict(config),
        "rng_state": torch.get_rng_state(),
    }


def save_checkpoints(state: dict[str, Any], workdir: Path) -> list[Path]:
    """Write every checkpoint file; returns them in table order (DCP skipped with a note)."""
    paths = [workdir / "train_mixed.pt", workdir / "weights_bf16.safetensors",
             workdir / "weights_fp32.safetensors"]
    torch.save(state, paths[0])
    safetensors.torch.save_file(state["model"], str(paths[1]))
    safetensors.torch.save_file(state["master_weights"], str(paths[2]))
    return paths + save_dcp(state, workdir / "dcp")


def save_dcp(state: dict[str, Any], directory: Path) -> list[Path]:
    """``torch.distributed.checkpoint.save`` without a process group; [] with a note if it fails."""
    shutil.rmtree(directory, ignore_errors=True)  # no files of an earlier run in the rows
    try:
        import torch.distributed.checkpoint as dcp

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(state, storage_writer=dcp.FileSystemWriter(str(directory)))
    except Exception as exc:  # any failure only drops these rows
        print(f"note: torch.distributed.checkpoint.save failed, DCP rows skipped: {exc!r}")
        return []
    return sorted(p for p in directory.iterdir() if p.is_file())


def make_checkpoints(args: argparse.Namespace, workdir: Path) -> list[Path]:
    """Train, save every format, and say what was trained."""
    base = QUICK if args.quick else TrainConfig()
    config = TrainConfig(**{**asdict(base), "seed": args.seed,
                            **({"steps": args.steps} if args.steps is not None else {})})
    torch.set_num_threads(2)
    corpus = stdlib_corpus()
    start = time.perf_counter()
    model, optimizer, losses = train(config, corpus)
    train_s = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    tail = losses[-20:]
    print(f"model: width {config.width}, {config.layers} layers, {config.heads} heads, seq {config.seq}, "
          f"batch {config.batch}, {params / 1e6:.2f}M parameters; corpus {len(corpus) / 2**20:.1f} MiB "
          f"of stdlib *.py")
    print(f"training: {config.steps} AdamW steps in {train_s:.1f}s; loss {losses[0] / math.log(2):.2f} -> "
          f"{sum(tail) / len(tail) / math.log(2):.2f} bits/byte (mean of last {len(tail)})", flush=True)
    state = mixed_state(model, optimizer, config, losses[-1])
    return save_checkpoints(state, workdir)


def existing_checkpoints(workdir: Path) -> list[Path]:
    """The files a previous run left in ``workdir``, in table order."""
    names = ["train_mixed.pt", "weights_bf16.safetensors", "weights_fp32.safetensors"]
    dcp_dir = workdir / "dcp"
    dcp_files = sorted(p for p in dcp_dir.iterdir() if p.is_file()) if dcp_dir.is_dir() else []
    return [workdir / name for name in names if (workdir / name).exists()] + dcp_files

