"""Train a tiny T5-family model from `transformers`, built from a config (no weights are
downloaded), on a synthetic copy-and-shift task, with AdamW.

    python t5_transformers.py --arch t5       # T5ForConditionalGeneration
    python t5_transformers.py --arch umt5     # UMT5ForConditionalGeneration

A healthy float32 run. T5's relative-position buckets take ``torch.log`` of each distance
over ``max_exact``; the distance is 0 on the diagonal, so the log is ``-inf`` there. The
result is cast to ``int64`` (``.to(torch.long)``), clamped and thrown away by
``torch.where(is_small, ...)``: the ``-inf`` never reaches a float again.
"""

from __future__ import annotations

import argparse

import torch
from transformers import (
    T5Config,
    T5ForConditionalGeneration,
    UMT5Config,
    UMT5ForConditionalGeneration,
)
from transformers.utils import logging as hf_logging


def make_batches(
    num: int, batch: int, seq_len: int, vocab: int, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Source sequences of random tokens; the target is the source shifted by one (mod vocab)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num):
        src = torch.randint(2, vocab, (batch, seq_len), generator=gen)
        out.append((src, (src + 1) % vocab))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", choices=["t5", "umt5"], default="t5")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=12)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    common = dict(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1,
        num_heads=2, relative_attention_num_buckets=8, relative_attention_max_distance=16,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    if args.arch == "t5":
        model = T5ForConditionalGeneration(T5Config(**common))
    else:
        model = UMT5ForConditionalGeneration(UMT5Config(**common))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model.train()
    for step, (src, tgt) in enumerate(make_batches(args.steps, args.batch, args.seq_len, 64, 0)):
        loss = model(input_ids=src, labels=tgt).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
