"""A text classifier: ``nn.TransformerEncoder`` over padded token sequences, masked mean pooling,
a linear head, trained with AdamW.

    python padded_text_encoder.py --steps 4                 # one batch holds an empty sequence
    python padded_text_encoder.py --steps 4 --no-empty      # every sequence has a token
    python padded_text_encoder.py --steps 4 --attention mha # one nn.MultiheadAttention layer
    python padded_text_encoder.py --steps 4 --attention manual  # attention written by hand

Padding is masked with ``src_key_padding_mask``: the attention adds ``-inf`` at the padded
keys, and the softmax absorbs it. At step 2 one sequence is empty (all padding): every
attention row of it is all ``-inf``, and its softmax is NaN (0/0). The masked mean pooling
``(out * mask).sum(1) / mask.sum(1)`` keeps the NaN (NaN * 0 = NaN), the loss is NaN and
AdamW writes NaN into every weight.

With ``--attention mha`` the model calls ``nn.MultiheadAttention`` itself, as many
classifiers do, with its default ``need_weights=True``: the attention weights are an
explicit softmax, and the empty sequence's rows, all ``-inf``, make NaN there first.
With ``--attention manual`` the attention is written out as many model files do
(``scores.masked_fill(padding, float("-inf"))``, then ``softmax``): the same NaN.
With ``nn.TransformerEncoder`` (the default) PyTorch's attention gives such rows zeros,
and the NaN is born at the pooling's 0/0.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self, vocab: int, d_model: int, n_classes: int, attention: str) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model, padding_idx=0)
        self.attention = attention
        if attention == "mha":
            self.attn = nn.MultiheadAttention(d_model, num_heads=2, batch_first=True)
            self.norm = nn.LayerNorm(d_model)
        elif attention == "manual":
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.norm = nn.LayerNorm(d_model)
        else:
            layer = nn.TransformerEncoderLayer(
                d_model, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True
            )
            self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        padding = tokens == 0
        x = self.emb(tokens)
        if self.attention == "mha":
            attended, _ = self.attn(x, x, x, key_padding_mask=padding)
            out = self.norm(x + attended)
        elif self.attention == "manual":
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            scores = q @ k.transpose(1, 2) / q.size(-1) ** 0.5
            scores = scores.masked_fill(padding.unsqueeze(1), float("-inf"))
            out = self.norm(x + torch.softmax(scores, dim=-1) @ v)
        else:
            out = self.encoder(x, src_key_padding_mask=padding)
        keep = (~padding).unsqueeze(-1).float()
        pooled = (out * keep).sum(1) / keep.sum(1)
        return self.head(pooled)


def make_batch(step: int, empty: bool, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(1, 30, (4, 10), generator=gen)
    lengths = torch.tensor([10, 7, 4, 2])
    if empty and step == 2:
        lengths[3] = 0  # an empty document
    tokens[torch.arange(10) >= lengths.unsqueeze(1)] = 0
    labels = tokens[:, 0] % 3
    return tokens, labels


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--no-empty", action="store_true")
    parser.add_argument("--attention", choices=["encoder", "mha", "manual"], default="encoder")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = Classifier(30, 16, 3, args.attention)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for step in range(args.steps):
        tokens, labels = make_batch(step, not args.no_empty, gen)
        loss = nn.functional.cross_entropy(model(tokens), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
