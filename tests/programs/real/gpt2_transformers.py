"""Train a tiny GPT-2 from `transformers`, built from a config (no weights are downloaded),
on synthetic token sequences, with AdamW.

    python gpt2_transformers.py                      # float32: trains; the causal mask's -inf is benign
    python gpt2_transformers.py --dtype float16      # pure float16 (model.half()): AdamW's eps rounds
                                                     # to 0, so 0/0 = NaN in the update at the first step
    python gpt2_transformers.py --dtype float16 --eps 1e-4   # an eps float16 can hold: stays finite
    python gpt2_transformers.py --gradient-checkpointing     # the forward runs again in backward

The attention is transformers' default (``sdpa``): on CPU PyTorch runs SDPA's math path,
which builds the causal mask with ``-inf`` on every forward.
"""

from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging


def make_batches(num: int, batch: int, seq_len: int, vocab: int, seed: int) -> list[torch.Tensor]:
    """Sequences that count upward with a random start and stride (mod vocab): learnable."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(num):
        start = torch.randint(0, vocab, (batch, 1), generator=gen)
        stride = torch.randint(1, 4, (batch, 1), generator=gen)
        batches.append((start + stride * torch.arange(seq_len)) % vocab)
    return batches


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--eps", type=float, default=1e-8, help="AdamW's eps")
    parser.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--gradient-checkpointing", action="store_true",
        help="model.gradient_checkpointing_enable(): each block's forward runs again in backward",
    )  # fmt: skip
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()

    config = GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config)
    if args.dtype == "float16":
        model = model.half()
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, eps=args.eps)
    batches = make_batches(args.steps, args.batch, args.seq_len, config.vocab_size, args.seed)

    model.train()
    for step, input_ids in enumerate(batches):
        outputs = model(input_ids=input_ids, labels=input_ids)
        loss = outputs.loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
