"""Train a tiny GPT-2 from `transformers` with the Hugging Face ``Trainer`` and its defaults:
``max_grad_norm=1.0`` (``clip_grad_norm_``) and the fused AdamW (``adamw_torch_fused``). The
model is built from a config (no weights are downloaded), the data are synthetic sequences.

    python gpt2_hf_trainer.py --lr 1e-3     # trains
    python gpt2_hf_trainer.py               # --lr 1e7: diverges

With the learning rate far too high the first update moves every weight by about 1e7 (Adam
moves each weight by about the learning rate); in the next forward pass a LayerNorm's variance
overflows and it makes NaN, the clip's in-place scale writes NaN into every gradient and the
fused AdamW writes NaN into every weight; the steps after read NaN weights.
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.utils import logging as hf_logging


class CountingUp(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Sequences that count upward with a random start and stride (mod vocab): learnable."""

    def __init__(self, size: int, seq_len: int, vocab: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (size, 1), generator=gen)
        stride = torch.randint(1, 4, (size, 1), generator=gen)
        self.rows = (start + stride * torch.arange(seq_len)) % vocab

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e7)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    config = GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config)
    data = CountingUp(args.steps * args.batch, args.seq_len, config.vocab_size, args.seed)
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.batch,
            learning_rate=args.lr, logging_steps=1, save_strategy="no", report_to=[],
            use_cpu=True, seed=args.seed, dataloader_num_workers=0, disable_tqdm=True,
        )  # fmt: skip
        trainer = Trainer(model=model, args=training, train_dataset=data)
        trainer.add_callback(PrintLoss())
        trainer.train()


class PrintLoss(TrainerCallback):
    """Prints each logged loss the way the other programs print theirs."""

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            print(f"step {state.global_step - 1} loss {logs['loss']}", flush=True)


if __name__ == "__main__":
    main()
