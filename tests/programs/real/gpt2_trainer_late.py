"""A tiny GPT-2 regressor trained by the Hugging Face ``Trainer`` with its defaults, that
diverges late, as a real run does: one sample of the data set is poisoned.

    python gpt2_trainer_late.py                  # the poisoned sample is met late: loss inf, then NaN
    python gpt2_trainer_late.py --clean          # the same run without it: trains to the end

``GPT2ForSequenceClassification`` (``num_labels=1``: regression, transformers' ``MSELoss``)
built from a tiny config (nothing is downloaded) learns the stride of sequences that count
upward. One label in the data set is ``3.4e38``, the largest float32, the way a table writes
a missing value: it is finite, but ``(prediction - label)**2`` overflows, so the
``mse_loss`` inside transformers makes ``inf``; its backward makes ``inf``/NaN gradients,
the Trainer's clipping (``max_grad_norm=1.0``) scales every gradient by NaN and the fused
AdamW writes NaN into every weight. The Trainer shuffles the data (its seeded sampler), so
the step that meets the sample is known only by running it: several hundred tiny steps in.

Everything else is the Trainer's default: AdamW (``adamw_torch_fused``), a linear schedule,
gradient clipping at 1.0, ``logging_nan_inf_filter``. :func:`make_trainer` builds the run
for the tests (tests/integration/test_sentinel_integrations.py).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2ForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.utils import logging as hf_logging

VOCAB = 64
SEQ_LEN = 8
BATCH = 4
STEPS = 240  # the Trainer's max_steps; the data set holds exactly that many batches
POISONED = 517  # the index of the poisoned sample (met at step 199 with seed 0)
MISSING = 3.4e38  # a missing value written as the largest float32


class Strides(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Sequences that count upward (mod the vocabulary); the label is the stride."""

    def __init__(self, size: int, seed: int, poisoned: int | None) -> None:
        gen = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (size, 1), generator=gen)
        stride = torch.randint(1, 4, (size, 1), generator=gen)
        self.ids = (start + stride * torch.arange(SEQ_LEN)) % VOCAB
        self.labels = stride[:, 0].float()
        if poisoned is not None:
            self.labels[poisoned] = MISSING

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def make_trainer(
    out: str | Path,
    *,
    poisoned: bool = True,
    steps: int = STEPS,
    seed: int = 0,
    callbacks: list[Any] | None = None,
    **arguments: Any,
) -> Trainer:
    """The run: the model from a tiny config, the data, the Trainer with its defaults
    (``arguments`` override ``TrainingArguments``, such as ``fp16=True``)."""
    torch.manual_seed(seed)
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    config = GPT2Config(
        n_layer=1, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=16,
        bos_token_id=0, eos_token_id=0, pad_token_id=0, num_labels=1,
    )  # fmt: skip
    model = GPT2ForSequenceClassification(config)
    data = Strides(STEPS * BATCH, seed, POISONED if poisoned else None)
    settings: dict[str, Any] = {
        "output_dir": str(out),
        "max_steps": steps,
        "per_device_train_batch_size": BATCH,
        "learning_rate": 1e-3,
        "seed": seed,
        "save_strategy": "no",
        "logging_steps": 20,
        "report_to": "none",
        "use_cpu": True,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        **arguments,
    }
    return Trainer(
        model=model,
        args=TrainingArguments(**settings),
        train_dataset=data,
        callbacks=callbacks,
    )


class PrintLoss(TrainerCallback):
    """Prints each logged loss the way the other programs print theirs."""

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            print(f"step {state.global_step - 1} loss {logs['loss']}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clean", action="store_true", help="no poisoned sample")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as out:
        trainer = make_trainer(
            out, poisoned=not args.clean, steps=args.steps, seed=args.seed, callbacks=[PrintLoss()]
        )
        trainer.train()
    finite = all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters())
    print("trained", trainer.state.global_step, "steps; weights finite:", finite)


if __name__ == "__main__":
    main()
