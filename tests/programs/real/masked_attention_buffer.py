"""A small causal self-attention language model whose additive mask is a module buffer:
trained, checkpointed with ``state_dict``, loaded into a fresh model and evaluated.

    python masked_attention_buffer.py --steps 4

The mask is made once, ``torch.full((T, T), -inf).triu(1)``, kept with
``register_buffer`` and added to the attention scores on every forward pass, where the
softmax absorbs it. The checkpoint holds it too (buffers are in the ``state_dict``):
``torch.load`` and ``load_state_dict`` write the ``-inf`` into the new model's buffer.
A healthy run: every ``-inf`` is intended.
"""

from __future__ import annotations

import argparse
import io
import math

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, block_size: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        mask = torch.full((block_size, block_size), float("-inf")).triu(1)
        self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att + self.mask[:T, :T]
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class TinyLM(nn.Module):
    def __init__(self, vocab: int, d_model: int, n_head: int, block_size: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, block_size, d_model))
        self.attn = CausalSelfAttention(d_model, n_head, block_size)
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos[:, : idx.size(1)]
        x = x + self.attn(self.ln(x))
        return self.head(x)


def batches(num: int, batch: int, seq_len: int, vocab: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    start = torch.randint(0, vocab, (num, batch, 1), generator=gen)
    return [(s + torch.arange(seq_len + 1)) % vocab for s in start]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    vocab, block = 32, 16
    model = TinyLM(vocab, 32, 2, block)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    for step, data in enumerate(batches(args.steps, 4, 12, vocab)):
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), data[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)

    checkpoint = io.BytesIO()
    torch.save(model.state_dict(), checkpoint)
    checkpoint.seek(0)
    restored = TinyLM(vocab, 32, 2, block)
    restored.load_state_dict(torch.load(checkpoint))
    restored.eval()
    with torch.no_grad():
        data = batches(1, 4, 12, vocab)[0]
        logits = restored(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), data[:, 1:].reshape(-1))
    print(f"restored nll {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
