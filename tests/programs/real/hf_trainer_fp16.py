"""A tiny GPT-2 in pure float16 trained by the Hugging Face ``Trainer``: ``python hf_trainer_fp16.py``.

Everything the program itself writes is set-up and ``trainer.train()``: the model is
``transformers``' own ``GPT2LMHeadModel`` (built from a config, nothing downloaded) and
the optimizer is the Trainer's AdamW (``adamw_torch``, eps=1e-8). In float16 that eps
rounds to 0 and the second moment underflows to 0, so the update's ``addcdiv_`` makes
0/0 = NaN at the first optimizer step, inside ``torch/optim``: the user's only frame is
``trainer.train()``, and the report also names the library frame the op ran in.
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.utils import logging as hf_logging

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 2


class Sequences(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Token sequences that count upward (mod the vocabulary): learnable."""

    def __init__(self, n: int, seq_len: int = 16, vocab: int = 64) -> None:
        gen = torch.Generator().manual_seed(0)
        start = torch.randint(0, vocab, (n, 1), generator=gen)
        self.ids = (start + torch.arange(seq_len)) % vocab

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    os.environ.setdefault("WANDB_DISABLED", "true")
    config = GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config).half()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, max_steps=STEPS, per_device_train_batch_size=8,
            learning_rate=3e-3, optim="adamw_torch", adam_epsilon=1e-8, report_to=[],
            save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True,
            dataloader_num_workers=0,
        )  # fmt: skip
        trainer = Trainer(model=model, args=args, train_dataset=Sequences(64))
        trainer.train()
    print("trained", STEPS, "steps")


if __name__ == "__main__":
    main()
