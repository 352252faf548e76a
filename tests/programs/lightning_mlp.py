"""A small LightningModule on generated data, for tests/integration/test_lightning.py.

``LogMLP(bad_step=K)`` feeds its batch through ``log`` (the line marked
``# <- origin``); at the trainer's global step K (on rank ``bad_rank``) one
input is zero, so ``log`` makes -inf there, ReLU and the head carry it to the
loss: a harmful Inf/NaN whose birth the program itself names (the test's
oracle). ``masked=True`` adds an attention-style pooling whose scores are
masked with -inf in place (the line marked ``# <- benign (in place)``) that softmax
absorbs: Inf in every step, never harmful (Lightning runs the training step inside
``optimizer.step(closure)``: an in-place op there is still forward work, not an
update). Nothing is downloaded.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl  # type: ignore[no-redef]

FEATURES = 8
BATCH = 4


class LogMLP(pl.LightningModule):
    def __init__(
        self, bad_step: int = -1, bad_rank: int = 0, masked: bool = False, lr: float = 0.05
    ) -> None:
        super().__init__()
        self.bad_step, self.bad_rank, self.masked, self.lr = bad_step, bad_rank, masked, lr
        self.hidden = nn.Linear(FEATURES, 16)
        if masked:  # only then (DDP wants every parameter used)
            self.score = nn.Linear(16, 1)
        self.head = nn.Linear(16, 1)
        # Attention-style mask over the 4 items of each group: the last two never count.
        self.register_buffer("mask", torch.tensor([False, False, True, True]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = torch.log(x)  # <- origin
        h = torch.relu(self.hidden(features))
        if self.masked:  # pool each group of 4 rows with softmax weights over unmasked rows
            scores = self.score(h).view(-1, 4)
            scores.masked_fill_(self.mask, float("-inf"))  # <- benign (in place)
            weights = scores.softmax(-1).view(-1, 1)
            h = h * weights * 4
        out: torch.Tensor = self.head(h)
        return out

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.global_step == self.bad_step and self.global_rank == self.bad_rank:
            x = x.clone()
            x[0, 0] = 0.0  # log(0) = -inf at this step (the injection the test checks against)
        loss = nn.functional.mse_loss(self(x), y)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def data(samples: int = 64, seed: int = 0) -> DataLoader[Any]:
    """Positive inputs (log is finite on them) and their targets, in batches of 4."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(samples, FEATURES, generator=gen) + 0.5
    y = x.sum(1, keepdim=True).log()
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=False)


def trainer(callbacks: list[Any], **options: Any) -> pl.Trainer:
    """A quiet CPU trainer: no progress bar, no summary, no logger or checkpoints unless asked."""
    settings: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        **options,
    }
    return pl.Trainer(callbacks=callbacks, **settings)
