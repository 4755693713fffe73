"""Train a small transformer language model for a few steps and torch.save its checkpoint.

The checkpoint is what a mixed-precision training job writes: bf16 weights, fp32 master
weights and AdamW state. Run by scripts/demo.sh with a path on an nvfs mount.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import time

import torch
from torch import nn


class TinyLM(nn.Module):
    """A decoder-only transformer of a few million parameters."""

    def __init__(self, vocab: int = 256, width: int = 256, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        block = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, batch_first=True)
        self.blocks = nn.TransformerEncoder(block, layers)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        return self.head(self.blocks(self.embed(tokens), mask=mask, is_causal=True))


def text_bytes() -> torch.Tensor:
    """Real text found on every machine: the Python standard library's own sources."""
    source = os.path.dirname(os.__file__)
    data = b"".join(pathlib.Path(source, name).read_bytes()
                    for name in sorted(os.listdir(source)) if name.endswith(".py"))
    return torch.frombuffer(bytearray(data[: 4 << 20]), dtype=torch.uint8).long()


def train(steps: int) -> dict:
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = text_bytes()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - 129, (8,))
        batch = torch.stack([data[s : s + 129] for s in starts])
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"trained {steps} steps, loss {loss.item():.3f}")
    return {
        "model_bf16": {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()},
        "master_fp32": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    checkpoint = train(args.steps)
    os.makedirs(os.path.dirname(args.path), exist_ok=True)
    started = time.perf_counter()
    torch.save(checkpoint, args.path)
    print(f"torch.save {args.path}: {os.path.getsize(args.path) / 2**20:.1f} MiB "
          f"in {time.perf_counter() - started:.2f}s")
    restored = torch.load(args.path)
    assert torch.equal(restored["master_fp32"]["head.weight"], checkpoint["master_fp32"]["head.weight"])


if __name__ == "__main__":
    main()
